"""`CausalConditionalCFM`: mel frames from noise by Euler steps of the DiT velocity.

docs/model_facts.md#code2wav-token2wav: the time grid is t_i = 1 - cos(i / n x pi / 2); each step
runs the estimator on 2 R rows, the conditional rows carrying (mu, speaker, cond) and the
unconditional rows zeros for all three, and moves x by dt x ((1 + rate) v_cond - rate v_uncond).
The start noise is a slice of one fixed noise stream (`rand_noise`, drawn once from a seeded
generator) at the row's estimator cache length, so windows continue one stream. Every ODE step
keeps its own DiT caches (`EstimatorCache`, step axis first).

`solve` is the pure tensor part (fixed shapes for fixed batch and bucket: CUDA-graph safe);
`forward_chunk` packs per-stream caches around it; `solve_pooled` reads them in place from an
`estimator_pool.EstimatorPool` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from backends.models.token2wav.batching import right_pad, window_first_mask
from backends.models.token2wav.config import CFMConfig
from backends.models.token2wav.dit import DiT

NOISE_SEED = 0  # the reference leaves its noise to the process RNG; any fixed draw will do


@dataclass(slots=True)
class EstimatorCache:
    """One stream's DiT caches for every ODE step; rows [conditional, unconditional]."""

    att: torch.Tensor  # [steps, depth, 2, H, L, 2 head_dim] float32, newest frames first
    cnn: torch.Tensor  # [steps, depth, 2, 2 hidden, 2] float32


@dataclass(frozen=True, slots=True)
class SolverInputs:
    """One window of R streams, padded to common lengths (row r of the DiT is stream r mod R,
    conditional for r < R)."""

    noise: torch.Tensor  # [R, 80, T] float32 start noise, zeros past a row's frames
    mu: torch.Tensor  # [R, 80, T] float32 encoder projection
    spks: torch.Tensor  # [R, 80] float32 projected speaker
    cond: torch.Tensor  # [R, 80, T] float32 prompt mel (zeros for generated frames)
    att: torch.Tensor  # [steps, depth, 2 R, H, L, 2 head_dim] float32, right-padded
    cnn: torch.Tensor  # [steps, depth, 2 R, 2 hidden, 2] float32
    key_valid: torch.Tensor  # [2 R, T + L] bool over [window | cache]
    num_new: torch.Tensor  # [2 R] int64 valid window frames per DiT row


@dataclass(frozen=True, slots=True)
class PooledSolverInputs:
    """`SolverInputs` whose caches stay in an `EstimatorPool` (passed to `solve_pooled`
    beside these): DiT row r reads pool row `rows[r]` at slots `order[r]`."""

    noise: torch.Tensor  # [R, 80, T]
    mu: torch.Tensor  # [R, 80, T]
    spks: torch.Tensor  # [R, 80]
    cond: torch.Tensor  # [R, 80, T]
    cnn: torch.Tensor  # [steps, depth, 2 R, 2 hidden, 2]
    key_valid: torch.Tensor  # [2 R, T + L] bool over [window | order's slots]
    num_new: torch.Tensor  # [2 R] int64
    rows: torch.Tensor  # [2 R] int64 pool row per DiT row
    order: torch.Tensor  # [2 R, L] int64 pool slots of each row's cache, newest frames first


@dataclass(frozen=True, slots=True)
class SolverOutputs:
    mel: torch.Tensor  # [R, 80, T] float32
    new_kv: torch.Tensor  # [steps, depth, 2 R, H, T, 2 head_dim] float32 this window's keys | values
    cnn: torch.Tensor  # [steps, depth, 2 R, 2 hidden, 2] float32


class CausalConditionalCFM(nn.Module):
    def __init__(self, config: CFMConfig) -> None:
        super().__init__()
        self.config = config
        self.estimator = DiT(config.estimator)
        generator = torch.Generator().manual_seed(NOISE_SEED)
        noise = torch.randn(1, config.estimator.out_channels, config.noise_frames, generator=generator)
        self.register_buffer("rand_noise", noise, persistent=False)  # [1, 80, noise_frames] float32
        # what runs the Euler loop: `solve`, or its CUDA-graph replays (`graphs.SolverGraphs`)
        self.solver: Callable[[SolverInputs], SolverOutputs] = self.solve
        self._constants: tuple[tuple, tuple[torch.Tensor, ...]] | None = None  # step_constants
        self._retired: list[torch.Tensor] = []  # constants replaced by other shapes or devices

    def new_cache(self, device: torch.device | str) -> EstimatorCache:
        c, e = self.config, self.config.estimator
        like = {"device": device, "dtype": self.estimator.in_proj.weight.dtype}
        return EstimatorCache(
            att=torch.zeros(c.n_timesteps, e.depth, 2, e.num_heads, 0, 2 * e.head_dim, **like),
            cnn=torch.zeros(c.n_timesteps, e.depth, 2, 2 * e.hidden_size, _CONTEXT, **like),
        )

    def time_grid(self, device: torch.device | str) -> torch.Tensor:
        """[n + 1] float32: 1 - cos(i / n x pi / 2)."""
        steps = torch.linspace(0, 1, self.config.n_timesteps + 1, device=device, dtype=torch.float32)
        return 1 - torch.cos(steps * 0.5 * torch.pi)

    def forward_chunk(
        self,
        mu: torch.Tensor,  # [R, 80, T_max]
        mel_frames: list[int],  # valid frames per row
        spks: torch.Tensor,  # [R, 80] projected speaker
        cond: torch.Tensor,  # [R, 80, T_max]
        caches: list[EstimatorCache],
    ) -> tuple[torch.Tensor, list[EstimatorCache]]:
        """-> (mel [R, 80, T_max], grown caches: this window's frames first, not pruned)."""
        inputs = self.pack(mu, mel_frames, spks, cond, caches)
        outputs = self.solver(inputs)
        return outputs.mel, self.unpack(outputs, mel_frames, caches)

    def start_noise(self, lengths: list[int], mel_frames: list[int], frames: int) -> torch.Tensor:
        """[R, 80, frames]: each row's slice of the noise stream at its cache length."""
        return right_pad([self._noise(offset, count) for offset, count in
                          zip(lengths, mel_frames)], dim=1, length=frames)

    def pack(self, mu: torch.Tensor, mel_frames: list[int], spks: torch.Tensor,
             cond: torch.Tensor, caches: list[EstimatorCache]) -> SolverInputs:
        """Start noise at each row's offset (its cache length) and the padded caches."""
        lengths = [c.att.shape[4] for c in caches]
        noise = self.start_noise(lengths, mel_frames, mu.shape[2])
        att = right_pad([c.att for c in caches], dim=4)  # [R, steps, depth, 2, H, L, 2 dk]
        cnn = torch.stack([c.cnn for c in caches])  # [R, steps, depth, 2, 2 hidden, 2]
        return SolverInputs(
            noise=noise, mu=mu, spks=spks, cond=cond,
            att=rows_last(att), cnn=rows_last(cnn),
            key_valid=window_first_mask(mel_frames * 2, mu.shape[2], lengths * 2,
                                        att.shape[5], mu.device),
            num_new=torch.tensor(mel_frames * 2, device=mu.device),
        )

    def _noise(self, offset: int, frames: int) -> torch.Tensor:
        if offset + frames > self.config.noise_frames:
            raise ValueError(f"noise stream exhausted: offset {offset} + {frames} frames > "
                             f"{self.config.noise_frames}")
        return self.rand_noise[0, :, offset : offset + frames]

    def solve(self, inputs: SolverInputs) -> SolverOutputs:
        """The Euler loop with classifier-free guidance (fixed shapes: graph-capturable)."""
        return self._euler(inputs, inputs.att, None)

    def solve_pooled(self, inputs: PooledSolverInputs, pool: torch.Tensor) -> SolverOutputs:
        """`solve` reading the caches in place from `pool` [steps, depth, pool rows, H,
        slots, 2 head_dim] (a fixed tensor: graph-capturable too)."""
        return self._euler(inputs, pool, (inputs.rows, inputs.order))

    def _euler(self, inputs: SolverInputs | PooledSolverInputs, att: torch.Tensor,
               cache_index: tuple[torch.Tensor, torch.Tensor] | None) -> SolverOutputs:
        rate = self.config.inference_cfg_rate
        steps, blocks, final = self.step_constants(inputs.mu.device)
        rows, channels = inputs.noise.shape[:2]
        estimator_in = _estimator_input(inputs)  # [2 R, 320, T]: a step rewrites x alone
        x = estimator_in[:rows, :channels]  # [R, 80, T] the conditional rows' x channels
        new_kv, new_cnn = [], []
        for step in range(self.config.n_timesteps):
            velocity, cnn, kv = self.estimator.forward_modulated(
                estimator_in, blocks[:, step : step + 1], final[step : step + 1],
                inputs.cnn[step], att[step], inputs.key_valid, inputs.num_new, cache_index,
            )
            if self.estimator.wants_fused_kernels(x):  # one kernel, the same roundings
                from backends.models.token2wav.euler_kernel import euler_step  # imports Triton

                euler_step(velocity, estimator_in, rows, channels, steps[step : step + 1], rate)
            else:
                v_cond, v_uncond = velocity.chunk(2)
                x.add_(steps[step] * ((1.0 + rate) * v_cond - rate * v_uncond))
                estimator_in[rows:, :channels].copy_(x)
            new_kv.append(kv)
            new_cnn.append(cnn)
        return SolverOutputs(mel=x.contiguous(), new_kv=torch.stack(new_kv), cnn=torch.stack(new_cnn))

    def step_constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (step sizes [n], the DiT's adaLN outputs at every step's t: `DiT.modulations`).
        They depend on the config and the weights alone, so a solve without autograd keeps
        them for the next, keyed on the storage and version of every weight they read. A
        load recomputes them into the same tensors, which captured graphs keep reading (a
        replay runs no Python: the next eager solve refreshes them). Never kept from inside a
        capture (its tensors belong to the graph): the capture's warm-up runs fill it first."""
        dit = self.estimator
        params = [*dit.t_embedder.parameters(), *dit.final_layer.adaLN_modulation.parameters(),
                  *(p for block in dit.blocks for p in block.adaLN_modulation.parameters())]
        # weights made in inference mode track no version (nor can they change outside it)
        key = (device, *((p.data_ptr(), -1 if p.is_inference() else p._version) for p in params))
        kept = self._constants
        if kept is not None and kept[0] == key and not torch.is_grad_enabled():
            return kept[1]
        times, steps = self.step_times(device)
        constants = (steps, *dit.modulations(times))
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if capturing or torch.is_grad_enabled():
            return constants
        if kept is not None and _refreshable(kept[1], constants):
            constants = tuple(old.copy_(new) for old, new in zip(kept[1], constants))
        else:
            self._retired.extend(kept[1] if kept is not None else ())  # graphs may read them
        self._constants = (key, constants)
        return constants

    def step_times(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (t at each Euler step [n], step sizes [n]) float32, accumulated as the reference
        does (t += dt; dt = grid[s + 1] - t), not read off the grid."""
        t_span = self.time_grid(device)
        t, dt = t_span[0:1], t_span[1:2] - t_span[0:1]
        times, steps = [], []
        for step in range(self.config.n_timesteps):
            times.append(t)
            steps.append(dt)
            t = t + dt
            dt = t_span[step + 2 : step + 3] - t if step + 2 < t_span.shape[0] else dt
        return torch.cat(times), torch.cat(steps)

    def unpack(self, outputs: SolverOutputs, mel_frames: list[int],
               caches: list[EstimatorCache]) -> list[EstimatorCache]:
        """Per stream: [this window's frames | its old cache] for every step and layer."""
        num = len(caches)
        grown = []
        for b, (frames, cache) in enumerate(zip(mel_frames, caches)):
            rows = [b, num + b]
            new = outputs.new_kv[:, :, rows, :, :frames]
            grown.append(EstimatorCache(torch.cat([new, cache.att], dim=4),
                                        outputs.cnn[:, :, rows].clone()))
        return grown


_CONTEXT = 2  # the DiT's causal convs keep two frames


def _estimator_input(inputs: SolverInputs | PooledSolverInputs) -> torch.Tensor:
    """[2 R, 320, T]: [x | mu | speaker | cond] in the conditional rows, [x | 0 | 0 | 0] in the
    unconditional ones, x starting as the noise. Built once per window (not repeated and
    concatenated at every step); the steps' arithmetic is the same, bit for bit."""
    mu = inputs.mu
    conditional = torch.cat([inputs.noise, mu, inputs.spks[:, :, None].expand_as(mu), inputs.cond], 1)
    unconditional = torch.cat([inputs.noise, torch.zeros_like(conditional[:, mu.shape[1]:])], 1)
    return torch.cat([conditional, unconditional])


def _refreshable(old: tuple[torch.Tensor, ...], new: tuple[torch.Tensor, ...]) -> bool:
    """`old` can take `new`'s values in place: same layouts, and writable here."""
    same = all((a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device) for a, b in zip(old, new))
    return same and (torch.is_inference_mode_enabled() or not any(a.is_inference() for a in old))


def rows_last(packed: torch.Tensor) -> torch.Tensor:
    """[R, steps, depth, 2, ...] -> [steps, depth, 2 R, ...] (conditional rows first)."""
    moved = packed.movedim(0, 3)  # [steps, depth, 2, R, ...]
    return moved.reshape(*moved.shape[:2], moved.shape[2] * moved.shape[3], *moved.shape[4:])
