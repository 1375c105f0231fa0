"""The GPU memory plan: bytes per stage computed from the checkpoint's sizes and the profile.

Each stage (thinker, talker, code2wav) needs weights, a per-session state pool (the runners'
paged KV, Code2Wav's pooled estimator caches), and graphs + workspaces (activations at the
largest captured batch, logits rows, allocator slack). Pools are computed exactly as the
engines allocate them (backends/stages/factory.py sizes them); weights from the config's
shapes; what cannot be computed gets a measured constant. Each stage's allocator share is its
planned bytes plus a proportional part of what is left of the card under MAX_GPU_SHARE; a
plan over the card raises MemoryPlanError naming the largest session count that fits.

`python -m backends.serving.memory_plan --profile gpu-h200 --device-gib 139.8` prints the table.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Mapping

from backends.audio.encoder_graphs import DEFAULT_MAX_ROWS as ENCODER_WORKING_ROWS
from backends.serving.profiles import GIB, MAX_GPU_SHARE, get_profile
from backends.stages.code2wav_engine import DEFAULT_MAX_BATCH as CODE2WAV_MAX_BATCH
from backends.stages.factory import BLOCK_SIZE, SLOT_MARGIN, code2wav_pool_streams

# Kept for what the plan misses: a share of the estimated part (graphs and workspaces, from
# measured constants and the largest batch) and a small one of the exact part (weights and
# pools, computed as the engines allocate them: allocator rounding). At 100 sessions on an H200
# every stage's serving peak stayed under its bytes before any margin
# (perf/results/duplex_h200.md), so a margin on the exact pools would only idle memory.
SAFETY_MARGIN = 0.10
EXACT_MARGIN = 0.01
# Measured constants (bf16). Thinker, after its warm-up on an H100 with 24 sessions at 4096
# tokens (perf/results/duplex_h100.md): 36.93 GiB allocated at peak, its largest warm-up group
# 16 sessions, so 16 encoder caches held. Weights, KV pool, logits rows and encoder caches are
# computed (one encoder cache per session, allocated on its first unit, plus the graphed pass's
# working rows); the rest of that peak is the fixed part (thinker_fixed_workspace).
THINKER_MEASURED = {"peak": round(36.93 * GIB), "sessions": 24, "window": 4096, "encoder_caches": 16}
# Code2Wav with graphs, bf16 flow and the pool: peak 1.35 GiB at 1 stream, 7.89 GiB at 16
# (perf/results/stages_h200.md): 1.35 GiB of weights + context, 0.436 GiB per batched window.
CODE2WAV_FIXED = round(1.35 * GIB)
CODE2WAV_PER_BATCHED_WINDOW = round((7.89 - 1.35) / 15 * GIB)
# Talker: not measured alone; its decode graphs replay at most max_sessions rows of a 768-wide
# model, so an allowance of 1 GiB for graphs and cuBLAS/Triton workspaces.
TALKER_WORKSPACE = 1 * GIB
LOGITS_BYTES = 4  # the samplers read float32 logits rows


class MemoryPlanError(ValueError):
    """The stages do not fit the device at the requested session count."""


@dataclass(frozen=True, slots=True)
class StageBytes:
    stage: str
    weights: int
    state: int  # the session state pool: KV pages or estimator caches
    workspace: int  # graphs, activations at the largest batch, logits rows, measured constants

    @property
    def computed(self) -> int:
        return self.weights + self.state + self.workspace

    @property
    def margin(self) -> int:
        return round(self.workspace * SAFETY_MARGIN + (self.weights + self.state) * EXACT_MARGIN)

    @property
    def total(self) -> int:
        return self.computed + self.margin


@dataclass(frozen=True, slots=True)
class PlanInputs:
    config: Mapping[str, Any]  # the checkpoint's config.json (`tts_config` inside)
    token2wav: Any  # backends.models.token2wav.Token2WavConfig
    max_sessions: int
    max_context_tokens: int
    talker_context_tokens: int
    dtype_bytes: int = 2
    null_blocks: int = 1  # the runners' padding block: 1 on CUDA, 0 on the CPU reference path
    code2wav_streams: int = 0  # Code2Wav cache-pool slots; 0: two per session (the factory's default)

    @property
    def pool_streams(self) -> int:
        return code2wav_pool_streams(self.code2wav_streams, self.max_sessions)


def kv_pool_bytes(layers: int, kv_heads: int, head_dim: int, sessions: int, max_len: int, dtype_bytes: int,
                  null_blocks: int = 1) -> int:
    """The runner's KVCache for a stage sized like StageSetup.runner_config; the CUDA fast path
    keeps one more block that padded rows write to (null_blocks; 0 on the CPU reference path)."""
    blocks = (sessions + SLOT_MARGIN) * -(-max_len // BLOCK_SIZE) + null_blocks
    return layers * 2 * blocks * BLOCK_SIZE * kv_heads * head_dim * dtype_bytes


def llm_weight_count(c: Mapping[str, Any], vocab: int, out_vocab: int, qk_norm: bool = True) -> int:
    """Parameters of a Llama/Qwen3 decoder: embeddings, attention (Qwen3's q/k norms), SwiGLU,
    norms, LM head (out_vocab 0: none)."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, c["num_key_value_heads"] * head_dim
    per_layer = hidden * (2 * q + 2 * kv) + 3 * hidden * c["intermediate_size"] + 2 * hidden
    per_layer += 2 * head_dim if qk_norm else 0
    return vocab * hidden + c["num_hidden_layers"] * per_layer + hidden + out_vocab * hidden


def audio_encoder_weight_count(a: Mapping[str, Any], llm_hidden: int) -> int:
    """The Whisper encoder (two convolutions, positions, layers, final norm) and its projector."""
    d, ffn = a["d_model"], a["encoder_ffn_dim"]
    per_layer = 4 * d * d + 3 * d + 2 * d * ffn + ffn + d + 4 * d  # k_proj has no bias
    convs = a["num_mel_bins"] * d * 3 + d + d * d * 3 + d
    projector = d * llm_hidden + llm_hidden + llm_hidden * llm_hidden + llm_hidden
    return convs + a["max_source_positions"] * d + a["encoder_layers"] * per_layer + 2 * d + projector


def thinker_bytes(p: PlanInputs) -> StageBytes:
    weights, state, logits, encoder = _thinker_parts(p.config, p.max_sessions, p.max_context_tokens, p.dtype_bytes,
                                                     p.null_blocks)
    workspace = logits + encoder * (p.max_sessions + ENCODER_WORKING_ROWS) + thinker_fixed_workspace(p.config)
    return StageBytes("thinker", weights, state, workspace)


def _thinker_parts(c: Mapping[str, Any], sessions: int, window: int, dtype_bytes: int,
                   null_blocks: int = 1) -> tuple[int, int, int, int]:
    """(weights, KV pool, logits rows, one encoder cache) of the Thinker, in bytes."""
    max_len = min(window, c["max_position_embeddings"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    state = kv_pool_bytes(c["num_hidden_layers"], c["num_key_value_heads"], head_dim, sessions, max_len,
                          dtype_bytes, null_blocks)
    count = llm_weight_count(c, c["vocab_size"], c["vocab_size"])
    count += audio_encoder_weight_count(c["audio_config"], c["hidden_size"])
    logits = (sessions + SLOT_MARGIN) * c["vocab_size"] * LOGITS_BYTES
    return count * dtype_bytes, state, logits, encoder_cache_bytes(c["audio_config"], dtype_bytes)


def encoder_cache_bytes(a: Mapping[str, Any], dtype_bytes: int) -> int:
    """One streaming encoder cache (backends/models/encoder_kv.py EncoderKVCache): keys and
    values of every layer over the whole position table."""
    head_dim = a["d_model"] // a["encoder_attention_heads"]
    return 2 * a["encoder_layers"] * a["encoder_attention_heads"] * a["max_source_positions"] * head_dim * dtype_bytes


def thinker_fixed_workspace(c: Mapping[str, Any]) -> int:
    """The Thinker's graphs and workspaces that do not grow with the sessions: the measured
    peak (bf16) less what is computed of it."""
    m = THINKER_MEASURED
    weights, state, logits, encoder = _thinker_parts(c, m["sessions"], m["window"], 2)
    return m["peak"] - weights - state - logits - encoder * (m["encoder_caches"] + ENCODER_WORKING_ROWS)


def talker_bytes(p: PlanInputs) -> StageBytes:
    t = p.config["tts_config"]
    max_len = min(p.talker_context_tokens, t["max_position_embeddings"])
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    state = kv_pool_bytes(t["num_hidden_layers"], t["num_key_value_heads"], head_dim, p.max_sessions, max_len,
                          p.dtype_bytes, p.null_blocks)
    # the Llama backbone, the text embedding (Thinker ids), the codec embedding and head, and
    # the projector of the Thinker's hidden rows
    hidden = t["hidden_size"]
    count = (llm_weight_count(t, t["backbone_vocab_size"], 0, qk_norm=False)
             + (t["num_text_tokens"] + 2 * t["num_audio_tokens"]) * hidden
             + t["llm_dim"] * hidden + hidden * hidden + 2 * hidden)
    logits = (p.max_sessions + SLOT_MARGIN) * t["num_audio_tokens"] * LOGITS_BYTES
    return StageBytes("talker", count * p.dtype_bytes, state, logits + TALKER_WORKSPACE)


def code2wav_pool_bytes(token2wav: Any, streams: int, dtype_bytes: int) -> int:
    """EstimatorPool.att: [steps, depth, 2 streams, heads, capacity + 1, 2 head_dim]."""
    cfm, hift = token2wav.flow.decoder, token2wav.hift
    capacity = round(token2wav.prompt_seconds * hift.sampling_rate / hift.hop_samples) + token2wav.cache_keep_frames
    e = cfm.estimator
    return cfm.n_timesteps * e.depth * 2 * streams * e.num_heads * (capacity + 1) * 2 * e.head_dim * dtype_bytes


def code2wav_bytes(p: PlanInputs) -> StageBytes:
    streams = p.pool_streams
    state = code2wav_pool_bytes(p.token2wav, streams, p.dtype_bytes)
    return StageBytes("code2wav", 0, state, CODE2WAV_FIXED + CODE2WAV_PER_BATCHED_WINDOW * CODE2WAV_MAX_BATCH)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    stages: tuple[StageBytes, ...]
    device_bytes: int
    max_sessions: int

    @property
    def total(self) -> int:
        return sum(s.total for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.total <= MAX_GPU_SHARE * self.device_bytes

    def shares(self) -> dict[str, float]:
        """Each stage's allocator cap: its planned bytes plus a proportional part of the spare."""
        if not self.fits:
            raise MemoryPlanError(f"{self.max_sessions} sessions need {self.total / GIB:.1f} GiB, over "
                                  f"{MAX_GPU_SHARE} of {self.device_bytes / GIB:.1f} GiB")
        scale = MAX_GPU_SHARE * self.device_bytes / self.total
        return {s.stage: int(1000 * s.total * scale / self.device_bytes) / 1000 for s in self.stages}

    def table(self) -> str:
        rows = ["| stage | weights GiB | state GiB | graphs + workspaces GiB | margin GiB | total GiB |",
                "|---|---|---|---|---|---|"]
        for s in self.stages:
            rows.append(f"| {s.stage} | {s.weights / GIB:.2f} | {s.state / GIB:.2f} | {s.workspace / GIB:.2f} | "
                        f"{s.margin / GIB:.2f} | {s.total / GIB:.2f} |")
        rows.append(f"| all ({self.max_sessions} sessions) |  |  |  |  | {self.total / GIB:.2f} of "
                    f"{MAX_GPU_SHARE * self.device_bytes / GIB:.2f} ({'fits' if self.fits else 'does not fit'}) |")
        return "\n".join(rows)


def plan(inputs: PlanInputs, device_bytes: int) -> MemoryPlan:
    stages = (thinker_bytes(inputs), talker_bytes(inputs), code2wav_bytes(inputs))
    return MemoryPlan(stages, device_bytes, inputs.max_sessions)


def largest_fitting_sessions(inputs: PlanInputs, device_bytes: int) -> int:
    """The most sessions (0 if none) whose plan fits the device."""
    low, high = 0, inputs.max_sessions
    while low < high:
        mid = (low + high + 1) // 2
        if plan(_with_sessions(inputs, mid), device_bytes).fits:
            low = mid
        else:
            high = mid - 1
    return low


def planned_shares(inputs: PlanInputs, device_bytes: int) -> dict[str, float]:
    """The stages' shares of one device, or MemoryPlanError saying what does not fit."""
    result = plan(inputs, device_bytes)
    if not result.fits:
        largest = largest_fitting_sessions(inputs, device_bytes)
        raise MemoryPlanError(
            f"the stages do not fit {device_bytes / GIB:.1f} GiB at {inputs.max_sessions} sessions "
            f"(Thinker window {inputs.max_context_tokens} tokens): {result.total / GIB:.1f} GiB planned, "
            f"{MAX_GPU_SHARE * device_bytes / GIB:.1f} GiB usable; the largest session count that fits is "
            f"{largest}\n{result.table()}")
    return result.shares()


def _with_sessions(inputs: PlanInputs, sessions: int) -> PlanInputs:
    return PlanInputs(inputs.config, inputs.token2wav, sessions, inputs.max_context_tokens,
                      inputs.talker_context_tokens, inputs.dtype_bytes, inputs.null_blocks, inputs.code2wav_streams)


def full_random_inputs(max_sessions: int, max_context_tokens: int, talker_context_tokens: int,
                       dtype_bytes: int = 2, code2wav_streams: int = 0) -> PlanInputs:
    """The released sizes (the full-random checkpoint's config); token ids do not change sizes."""
    from backends.checkpoint.full_random import FullRandomCheckpoint, full_random_config_dict

    return PlanInputs(full_random_config_dict(0, 0), FullRandomCheckpoint.token2wav_config(), max_sessions,
                      max_context_tokens, talker_context_tokens, dtype_bytes, code2wav_streams=code2wav_streams)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="gpu-h200")
    parser.add_argument("--device-gib", type=float, default=139.8,
                        help="the card's memory as torch reports it (H200 139.8, H100 79.2)")
    parser.add_argument("--sessions", type=int, default=0, help="override the profile's max_sessions")
    parser.add_argument("--code2wav-streams", type=int, default=-1,
                        help="override the profile's code2wav_streams (0: two per session)")
    parser.add_argument("--window", type=int, default=0, help="override the profile's max_context_tokens")
    parser.add_argument("--talker-window", type=int, default=0, help="override the profile's talker_context_tokens")
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    inputs = full_random_inputs(args.sessions or profile.max_sessions, args.window or profile.max_context_tokens,
                                args.talker_window or profile.talker_context_tokens,
                                2 if profile.dtype == "bfloat16" else 4,
                                args.code2wav_streams if args.code2wav_streams >= 0 else profile.code2wav_streams)
    result = plan(inputs, round(args.device_gib * GIB))
    print(result.table())
    if result.fits:
        print("shares: " + ", ".join(f"{k} {v}" for k, v in result.shares().items()))
    else:
        print(f"largest session count that fits: {largest_fitting_sessions(inputs, result.device_bytes)}")


if __name__ == "__main__":
    main()
