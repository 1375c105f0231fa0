"""`euler_kernel.euler_step`: the CFM's guided Euler step as one kernel equals the torch ops it
replaces bit for bit (CPU: Triton's interpreter; CUDA: the compiled kernel, marked gpu), and a
whole solve through the fused estimator takes it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tiny_steps import tiny_with_steps  # noqa: E402

from backends.models.token2wav.euler_kernel import euler_step  # noqa: E402

RATE = 0.7  # the served inference_cfg_rate
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _torch_step(velocity: torch.Tensor, estimator_in: torch.Tensor, rows: int, channels: int,
                step_size: torch.Tensor) -> None:
    """`CausalConditionalCFM._euler`'s torch expressions."""
    x = estimator_in[:rows, :channels]
    v_cond, v_uncond = velocity.chunk(2)
    x.add_(step_size[0] * ((1.0 + RATE) * v_cond - RATE * v_uncond))
    estimator_in[rows:, :channels].copy_(x)


def _check(device: str, dtype: torch.dtype, rows: int = 3, channels: int = 80,
           frames: int = 50, transposed: bool = True, layout: str = "contiguous") -> None:
    gen = torch.Generator().manual_seed(rows * frames)
    estimator_in = (torch.randn(2 * rows, 320, frames, generator=gen) * 2).to(device, dtype)
    if layout == "frame-major":  # any strides: [2R, T, 320] in memory
        estimator_in = estimator_in.transpose(1, 2).contiguous().transpose(1, 2)
    steps = torch.rand(4, generator=gen).to(device)  # float32, as `step_times` gives them
    expected = estimator_in.clone()
    for step in range(4):
        raw = torch.randn(2 * rows * frames, channels, generator=gen) * 3
        # the fused estimator's velocity: a [2R, C, T] view of its [2R T, C] final linear
        velocity = (raw.view(2 * rows, frames, channels).transpose(1, 2) if transposed
                    else raw.view(2 * rows, channels, frames)).to(device, dtype)
        euler_step(velocity, estimator_in, rows, channels, steps[step : step + 1], RATE)
        _torch_step(velocity, expected, rows, channels, steps[step : step + 1])
        assert torch.equal(estimator_in, expected), f"step {step}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.interpreter
def test_euler_step_equals_torch_ops(dtype: torch.dtype) -> None:
    _check("cpu", dtype)
    _check("cpu", dtype, rows=1, frames=7, transposed=False)  # one block, contiguous velocity
    _check("cpu", dtype, rows=2, frames=5, layout="frame-major")


def test_euler_step_rejects_mismatched_operands() -> None:
    estimator_in = torch.zeros(4, 320, 10)
    with pytest.raises(ValueError, match="does not match"):
        euler_step(torch.zeros(4, 80, 9), estimator_in, 2, 80, torch.ones(1), RATE)
    with pytest.raises(ValueError, match="does not match"):
        euler_step(torch.zeros(4, 80, 10), estimator_in, 1, 80, torch.ones(1), RATE)
    with pytest.raises(ValueError, match="one step size"):
        euler_step(torch.zeros(4, 80, 10), estimator_in, 2, 80, torch.ones(2), RATE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_euler_step_equals_torch_ops_on_cuda(dtype: torch.dtype) -> None:
    """The compiled kernel, at a steady window (50 frames) for 1 and 16 streams."""
    for rows in (1, 16):
        _check("cuda", dtype, rows=rows)
    _check("cuda", dtype, rows=2, frames=56, transposed=False)


@pytest.mark.interpreter
def test_fused_solve_takes_the_kernel_with_the_same_mel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny CFM's solve through its fused estimator (interpreted here) runs one kernel
    step per Euler step, and its mel and caches equal the same solve with the torch step, bit
    for bit. Three Euler steps instead of the served ten: a first, a middle and a last step of
    the cosine grid, each a whole interpreted estimator pass."""
    from backends.models.token2wav import euler_kernel
    from backends.models.token2wav.assets import random_token2wav
    from backends.models.token2wav.cfm import SolverInputs

    cfm = random_token2wav(tiny_with_steps(3), seed=0).flow.decoder
    cfm.estimator.fused = True
    c, steps = cfm.estimator.config, cfm.config.n_timesteps
    gen = torch.Generator().manual_seed(4)
    rows, frames, cached = 2, 3, 2
    inputs = SolverInputs(
        noise=torch.randn(rows, 80, frames, generator=gen), mu=torch.randn(rows, 80, frames, generator=gen),
        spks=torch.randn(rows, 80, generator=gen), cond=torch.zeros(rows, 80, frames),
        att=torch.randn(steps, c.depth, 2 * rows, c.num_heads, cached, 2 * c.head_dim, generator=gen),
        cnn=torch.randn(steps, c.depth, 2 * rows, 2 * c.hidden_size, 2, generator=gen),
        key_valid=torch.ones(2 * rows, frames + cached, dtype=torch.bool),
        num_new=torch.full((2 * rows,), frames))
    calls = []
    kernel_step = euler_kernel.euler_step

    def counted(*args: object) -> None:
        calls.append(args)
        kernel_step(*args)  # type: ignore[arg-type]

    def torch_step(velocity: torch.Tensor, estimator_in: torch.Tensor, rows: int, channels: int,
                   step_size: torch.Tensor, rate: float) -> None:
        assert rate == RATE
        _torch_step(velocity, estimator_in, rows, channels, step_size)

    outputs = []
    for step in (counted, torch_step):
        monkeypatch.setattr(euler_kernel, "euler_step", step)
        with torch.inference_mode():
            outputs.append(cfm.solve(inputs))
    assert len(calls) == steps == 3
    for name in ("mel", "new_kv", "cnn"):
        assert torch.equal(getattr(outputs[0], name), getattr(outputs[1], name)), name
