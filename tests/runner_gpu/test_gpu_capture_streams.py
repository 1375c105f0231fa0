"""The runner's graph captures warm up on one side stream per capture loop.

The allocator caches blocks per stream: a fresh warm-up stream per capture keeps every
warm-up's blocks reserved apart (the audio encoder's 18 graphs held ~6.7 GB that way at the
real sizes, tests/audio/test_encoder_graphs.py). A spy on `capture_graph` in each loop's
module records the stream it is handed. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from gpu_models import runner_for  # noqa: E402

import backends.runner.cuda_graphs as cuda_graphs  # noqa: E402
import backends.runner.decode_chain as decode_chain  # noqa: E402
import backends.runner.mixed_graphs as mixed_graphs  # noqa: E402


def test_each_capture_loop_hands_one_warm_up_stream(make_gpu_model, monkeypatch) -> None:
    sides: dict[str, list[object]] = {}
    for module in (cuda_graphs, decode_chain, mixed_graphs):
        real = module.capture_graph

        def spy(run, pool, steps, side=None, name=module.__name__, real=real):
            sides.setdefault(name, []).append(side)
            return real(run, pool, steps, side)

        monkeypatch.setattr(module, "capture_graph", spy)
    runner_for(make_gpu_model(torch.bfloat16), max_model_len=512, num_blocks=8 * 32,
               decode_chain_lengths=(4,))
    names = {m.__name__ for m in (cuda_graphs, decode_chain, mixed_graphs)}
    assert set(sides) == names, sides.keys()
    for name, handed in sides.items():
        assert len(handed) > 1 and handed[0] is not None, (name, handed)
        assert all(side is handed[0] for side in handed), name
