"""The Talker's fused draw kernel on a GPU: the torch path's tokens, in graphed decode chains.

Strategy (skipped without CUDA): (1) the kernel compiled for the GPU against the torch path
(`SamplingStates`) on the real vocabulary, over every chunk-budget state, greedy, policy-off,
scratch and padding rows, for several steps in a row (the tables evolve): tokens and tables
equal except rows float rounding may decide (see test_fused_draw.py; there should be none).
(2) Two Talker engines with graphs and decode chains (lengths 4 and 8), one drawing with the
kernel (the default on CUDA) and one with the torch path (a policy table without its fused
draw), over the long plans: every code, KV ledger and penalty window identical. (3) A fused
step queues its work without a host sync.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from test_device_policy import RepetitiveTalker, long_plan, run_sessions, window  # noqa: E402
from test_device_policy_gpu import GPU_TALKER, runner_config  # noqa: E402
from test_fused_draw import budget_pair, compare, random_logits  # noqa: E402

from backends.models.talker_policy import CODEC_EOS, TalkerSamplingConfig  # noqa: E402
from backends.runner.fused_draw import FusedSamplingStates  # noqa: E402
from backends.stages.talker_engine import TalkerEngine  # noqa: E402
from backends.talker import device_policy  # noqa: E402
from backends.talker.policy_table import TalkerPolicyTable  # noqa: E402

pytestmark = pytest.mark.gpu


def test_kernel_draws_the_torch_tokens_on_the_gpu() -> None:
    gen = torch.Generator().manual_seed(3)
    pair, slots, positions = budget_pair(gen, "cuda", CODEC_EOS)
    unclear = 0
    for step in range(6):
        logits = random_logits(gen, len(slots), vocab=CODEC_EOS + 1).cuda()
        unclear += compare(pair, logits, slots, positions + step)[0]
        pair.torch_table.table.copy_(pair.fused_table.table)  # continue from equal states
    assert unclear <= 1


def talker_engine(fused: bool, eos_bias: float, monkeypatch: pytest.MonkeyPatch) -> TalkerEngine:
    torch.manual_seed(7)
    model = RepetitiveTalker(GPU_TALKER, eos_bias).eval().to(device="cuda", dtype=torch.float32)
    config = dataclasses.replace(runner_config(True), dtype=torch.float32)
    monkeypatch.setattr(device_policy, "TalkerPolicyTable", functools.partial(TalkerPolicyTable, fused=fused))
    engine = TalkerEngine(model, config, TalkerSamplingConfig(), chain_lengths=(4, 8))
    sampling = engine.runner.fast_path.sampling  # type: ignore[union-attr]
    assert isinstance(sampling, FusedSamplingStates) == fused
    return engine


@pytest.mark.parametrize("eos_bias", [-9.0, 2.0])
def test_graphed_chains_stream_the_torch_path_codes(
    eos_bias: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    fused = talker_engine(True, eos_bias, monkeypatch)
    reference = talker_engine(False, eos_bias, monkeypatch)
    assert fused.runner.chains.num_captured == 3 * 2  # type: ignore[union-attr]
    expected = run_sessions(reference, long_plan, 3)
    assert run_sessions(fused, long_plan, 3) == expected
    for request_id in expected:
        assert fused.runner.token_ids(request_id) == reference.runner.token_ids(request_id)
        assert window(fused, request_id) == window(reference, request_id)


def test_a_fused_draw_queues_without_host_sync() -> None:
    gen = torch.Generator().manual_seed(5)
    pair, slots, positions = budget_pair(gen, "cuda", CODEC_EOS)
    logits = random_logits(gen, len(slots), vocab=CODEC_EOS + 1).cuda()
    pair.fused.sample(logits, slots, positions)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = pair.fused.sample(logits, slots, positions + 1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert tokens.shape == slots.shape
