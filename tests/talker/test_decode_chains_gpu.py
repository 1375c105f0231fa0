"""The Talker engine's decode chains on a GPU: graphed chains stream the single-step codes.

Strategy (skipped without CUDA): the Talker of test_device_policy_gpu.py in float32 (a chain
keeps finished rows in its batch where single steps drop them, so batch shapes differ: float32
keeps cuBLAS's shape-dependent rounding far below any sampling tie, bf16 might not), graphs
on, one engine with chains (lengths 4 and 8) and one without, over the long plans (rollovers,
new turns, empty handoffs, turn ends; EOS unwanted or favoured): every code, KV ledger and
penalty window must be identical, and the chain graphs must have been captured.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from test_device_policy import long_plan, run_sessions, window  # noqa: E402
from test_device_policy import RepetitiveTalker  # noqa: E402
from test_device_policy_gpu import GPU_TALKER, runner_config  # noqa: E402

from backends.models.talker_policy import TalkerSamplingConfig  # noqa: E402
from backends.stages.talker_engine import TalkerEngine  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("eos_bias", [-9.0, 2.0])
def test_graphed_chains_stream_the_single_step_codes(eos_bias: float) -> None:
    torch.manual_seed(7)
    model = RepetitiveTalker(GPU_TALKER, eos_bias).eval().to(device="cuda", dtype=torch.float32)
    config = dataclasses.replace(runner_config(True), dtype=torch.float32)
    sampling = TalkerSamplingConfig()
    chained = TalkerEngine(model, config, sampling, chain_lengths=(4, 8))
    stepped = TalkerEngine(model, config, sampling, chain_lengths=())
    assert chained.runner.chains.num_captured == 3 * 2  # buckets 1, 2, 4  # type: ignore[union-attr]
    expected = run_sessions(stepped, long_plan, 3)
    assert run_sessions(chained, long_plan, 3) == expected
    for request_id in expected:
        assert chained.runner.token_ids(request_id) == stepped.runner.token_ids(request_id)
        assert window(chained, request_id) == window(stepped, request_id)
