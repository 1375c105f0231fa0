"""The Talker's device chunk policy on a GPU: graphs equal eager, no host sync in a step.

Strategy (skipped without CUDA): a small random Talker (bf16, Triton fast path) whose logits
favour a few codes, so the 16-code penalty window keeps steering draws. (1) An engine whose
decode steps replay CUDA graphs (forward graph + sampling graph: policy, draw, policy update)
must stream exactly the codes of the same engine run eagerly, with the same KV ledgers and
penalty windows, over plans with rollovers, new turns, empty handoffs and early EOS. (2) With
greedy sampling the device policy must equal the host-hook policy on the GPU too (same
logits; the policy arithmetic is exact). (3) A graphed decode step, a mixed prefill + decode
step and a chunk-budget write queue their work without a single host-device sync (torch's
sync debug mode set to "error"); the one wait comes after, on the step's async output.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from test_device_policy import (  # noqa: E402
    RepetitiveTalker,
    long_plan,
    run_sessions,
    window,
)

from backends.models.talker import TalkerConfig  # noqa: E402
from backends.models.talker_policy import (  # noqa: E402
    CHUNK_BUDGETS,
    CODEC_EOS,
    ChunkKind,
    TalkerSamplingConfig,
)
from backends.runner.model_runner import ModelRunner  # noqa: E402
from backends.runner.types import RunnerConfig, StepInput  # noqa: E402
from backends.stages.talker_engine import TalkerEngine  # noqa: E402
from backends.talker.policy_table import TalkerPolicyTable  # noqa: E402

pytestmark = pytest.mark.gpu
CONTEXT = 256
GPU_TALKER = TalkerConfig(
    llm_dim=16, hidden_size=128, intermediate_size=256, num_attention_heads=2,
    num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=CONTEXT,
    num_text_tokens=64, audio_bos_token_id=60, text_eos_token_id=61,
)  # fmt: skip


def gpu_model(eos_bias: float) -> RepetitiveTalker:
    torch.manual_seed(7)
    model = RepetitiveTalker(GPU_TALKER, eos_bias).eval()
    return model.to(device="cuda", dtype=torch.bfloat16)


def runner_config(graphs: bool, max_num_reqs: int = 4) -> RunnerConfig:
    return RunnerConfig(
        num_blocks=max_num_reqs * CONTEXT // 16, max_num_reqs=max_num_reqs,
        max_model_len=CONTEXT, device="cuda", dtype=torch.bfloat16,
        attention_backend="triton", use_cuda_graphs=graphs, cuda_graph_sizes=(1, 2, 4),
    )  # fmt: skip


def engine(model, graphs: bool, sampling: TalkerSamplingConfig, device_policy=None):
    return TalkerEngine(model, runner_config(graphs), sampling, device_policy=device_policy)


@pytest.mark.parametrize("eos_bias", [-9.0, 2.0])
def test_graph_replay_streams_the_eager_codes(eos_bias: float) -> None:
    model = gpu_model(eos_bias)
    sampling = TalkerSamplingConfig()
    graphed, eager = engine(model, True, sampling), engine(model, False, sampling)
    graphs = graphed.runner.fast_path.graphs  # type: ignore[union-attr]
    assert graphs.is_captured and graphs.is_sampling_captured
    assert not eager.runner.fast_path.graphs.is_captured  # type: ignore[union-attr]
    expected = run_sessions(eager, long_plan, 3)
    assert run_sessions(graphed, long_plan, 3) == expected
    for request_id in expected:
        assert graphed.runner.token_ids(request_id) == eager.runner.token_ids(request_id)
        assert window(graphed, request_id) == window(eager, request_id)


def test_greedy_device_policy_equals_the_host_hook_on_gpu() -> None:
    model = gpu_model(2.0)
    sampling = TalkerSamplingConfig(temperature=0.0, repetition_penalty=1.5)
    device = engine(model, True, sampling, device_policy=True)
    host = engine(model, True, sampling, device_policy=False)
    assert run_sessions(device, long_plan, 3) == run_sessions(host, long_plan, 3)


def test_talker_steps_queue_without_host_sync() -> None:
    model = gpu_model(-9.0)
    table = TalkerPolicyTable(4, "cuda", TalkerSamplingConfig(), CODEC_EOS)
    runner = ModelRunner(model, runner_config(True), table)
    params = TalkerSamplingConfig().to_sampling_params()
    for i, request_id in enumerate(("a", "b", "c")):
        runner.add_request(request_id, dataclasses.replace(params, seed=i), None, CONTEXT)
        table.open(runner.states.slot_of(request_id))
        table.begin_chunk(runner.states.slot_of(request_id), CHUNK_BUDGETS[ChunkKind.TURN_END])
    rows = torch.randn(6, GPU_TALKER.hidden_size, device="cuda", dtype=torch.bfloat16)
    first = runner.step([StepInput(rid, [0] * 6, rows) for rid in ("a", "b")])
    second = runner.step([StepInput(r.request_id, [r.token]) for r in first])  # warm graphs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        table.begin_chunk(runner.states.slot_of("a"), CHUNK_BUDGETS[ChunkKind.MID_TURN])
        decode = runner.launch_step([StepInput(r.request_id, [r.token]) for r in second])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    results = decode.wait()  # the step's one wait, outside the check
    assert all(r.token is not None for r in results)
    torch.cuda.set_sync_debug_mode("error")
    try:
        mixed = runner.launch_step(
            [StepInput("c", [0] * 6, rows)] + [StepInput(r.request_id, [r.token]) for r in results]
        )
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(0 <= r.token <= CODEC_EOS for r in mixed.wait())
