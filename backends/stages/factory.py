"""Build each stage engine from its model-config parameters (the rendered profile).

Called from the stage `model.py` files, and by tests and tools that run the pipeline
in-process. On CPU each stage process uses one torch thread: the stages share two cores
with the orchestrator, and tiny matmuls lose more to thread hand-off than they gain.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from backends.checkpoint.full_random import FullRandomCheckpoint, full_random_checkpoint
from backends.checkpoint.loader import Checkpoint, load_checkpoint
from backends.checkpoint.prepare import FULL_RANDOM, prepare_checkpoint
from backends.models.token2wav.estimator_pool import EstimatorPool
from backends.runner.types import RunnerConfig
from backends.stages.code2wav_service import Code2WavService
from backends.stages.window_schedule import FIRST_WINDOW_HOLD_S

BLOCK_SIZE = 16
SLOT_MARGIN = 2  # requests of an epoch being stopped while the next one starts
# Code2Wav cache-pool slots per session: an epoch's stream lives until its STOP lands while the
# next epoch's may have started (barge-in)
CODE2WAV_STREAMS_PER_SESSION = 2
WARMUP_TEXT_TOKEN = 100  # a plain text id of every Thinker vocabulary, handed in Talker warm-ups
LOG = logging.getLogger(__name__)


def code2wav_pool_streams(configured: int, max_sessions: int) -> int:
    """Code2Wav's cache-pool slots: the profile's `code2wav_streams`, or two per session at 0."""
    return configured or CODE2WAV_STREAMS_PER_SESSION * max_sessions


@dataclass(frozen=True, slots=True)
class StageSetup:
    checkpoint: str
    device: torch.device
    dtype: torch.dtype
    max_sessions: int
    max_context_tokens: int
    talker_context_tokens: int

    @staticmethod
    def from_params(params: dict[str, str], device_id: str = "0") -> "StageSetup":
        device = torch.device(f"cuda:{device_id}" if params.get("device", "cpu") == "cuda" else "cpu")
        # One intra-op thread on every device: a stage's host tensors are small (a unit's mel
        # frames, a logits row), where pool wake-ups cost more than they save (100 mel frames:
        # 11 ms on 2 threads, 0.2 ms on one; on a 16-core GPU host the Thinker's mel took
        # 11 ms per unit with the default pool).
        torch.set_num_threads(1)
        if device.type == "cuda":  # streams and graph captures made without a device go here
            torch.cuda.set_device(device)
        return StageSetup(
            checkpoint=params.get("checkpoint", "tiny"), device=device,
            dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[params.get("dtype", "float32")],
            max_sessions=int(params.get("max_sessions", "4")),
            max_context_tokens=int(params.get("max_context_tokens", "8192")),
            talker_context_tokens=int(params.get("talker_context_tokens", "4096")),
        )

    def load(self) -> Checkpoint | FullRandomCheckpoint:
        if self.checkpoint == FULL_RANDOM:
            return full_random_checkpoint()  # real dimensions, weights drawn on the device
        cache = Path(os.environ.get("MINICPMO_HOME", Path(__file__).resolve().parents[2] / "var")) / "checkpoints"
        path = prepare_checkpoint(self.checkpoint, cache)
        return load_checkpoint(path)

    def runner_config(self, max_len: int) -> RunnerConfig:
        blocks_per_request = -(-max_len // BLOCK_SIZE)
        num_reqs = self.max_sessions + SLOT_MARGIN
        # On CUDA: the Triton-language paged attention, CUDA graphs for decode batches, and the
        # Triton GEMV with the norms and SwiGLU folded in; hooked rows reach the host as
        # summaries (RunnerConfig.compact_rows_on_cpu). On CPU: the torch reference path.
        cuda = self.device.type == "cuda"
        return RunnerConfig(num_blocks=num_reqs * blocks_per_request, max_num_reqs=num_reqs, max_model_len=max_len,
                            block_size=BLOCK_SIZE, device=str(self.device), dtype=self.dtype,
                            attention_backend="triton" if cuda else "reference",
                            gemv_backend="triton" if cuda else "cublas")


def build_thinker_engine(params: dict[str, str], device_id: str = "0"):
    from backends.stages.thinker_engine import ThinkerEngine, ThinkerEngineConfig
    from backends.thinker.model import ThinkerModel

    setup = StageSetup.from_params(params, device_id)
    ckpt = setup.load()
    if isinstance(ckpt, FullRandomCheckpoint):
        model = ThinkerModel.from_full_random(ckpt, setup.device, setup.dtype)
    else:
        model = ThinkerModel.from_checkpoint(ckpt, setup.device, setup.dtype)
    max_len = min(setup.max_context_tokens, ckpt.config.llm.max_position_embeddings)
    runner_config = setup.runner_config(max_len)
    random_weights = isinstance(ckpt, FullRandomCheckpoint) or ckpt.is_tiny
    config = ThinkerEngineConfig(max_context_tokens=max_len, prefill_chunk_rows=prefill_chunk_rows(runner_config),
                                 listen_when_silent=random_weights,
                                 window_mode=params.get("sliding_window_mode", "off") or "off")
    engine = ThinkerEngine(model.llm, model.audio_encoder, ckpt.tokenizer, ckpt.special_tokens, runner_config, config,
                           default_voice=thinker_default_voice(ckpt))
    if setup.device.type == "cuda":  # Triton kernels compile now, not inside the first replies
        from backends.stages.warmup import thinker_request, warm_up

        engine.runner.warm_attention()  # variants no warm-up request may reach (prompt shapes)
        warm_up(engine, "thinker", thinker_request, setup.max_sessions)
        log_allocation("thinker", setup.device, engine.runner.kv.num_bytes())
    return engine


def thinker_default_voice(ckpt: Checkpoint | FullRandomCheckpoint) -> np.ndarray:
    """The default voice the Thinker hears when a session gives no REF_AUDIO (the official demo
    feeds its default clip to the Thinker too): the checkpoint's HT_ref_audio.wav at 16 kHz; the
    full-random profile has no files, so the tiny generator's synthetic voice stands in."""
    from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
    from backends.models.token2wav.resample import resample

    if isinstance(ckpt, FullRandomCheckpoint):
        return synthesize_reference_voice(ckpt.seed)
    audio, rate = ckpt.reference_voice()
    if rate != REFERENCE_VOICE_SAMPLE_RATE:
        audio = resample(torch.from_numpy(audio).float(), rate, REFERENCE_VOICE_SAMPLE_RATE).numpy()
    return np.ascontiguousarray(audio, dtype=np.float32)


def prefill_chunk_rows(config: RunnerConfig) -> int:
    """Where steps replay graphs, a longer prefill goes in chunks the mixed graphs hold
    (backends/thinker/prefill_chunks.py); elsewhere (CPU: every step is eager) in one step."""
    graphed = config.is_fast_path and config.use_cuda_graphs and config.mixed_cuda_graphs
    if not graphed or not config.device.startswith("cuda"):
        return 0
    return config.mixed_graph_max_query_len


def build_talker_engine(params: dict[str, str], device_id: str = "0"):
    from backends.stages.talker_engine import TalkerEngine

    from backends.models.talker import TalkerConfig, TalkerModel, load_talker_weights

    setup = StageSetup.from_params(params, device_id)
    ckpt = setup.load()
    config = TalkerConfig.from_dict(ckpt.config.raw["tts_config"])
    if isinstance(ckpt, FullRandomCheckpoint):
        model = ckpt.build_talker(setup.device, setup.dtype)
    else:
        with torch.device(setup.device):
            model = TalkerModel(config)
        load_talker_weights(model, ckpt.weights("tts."))
        model = model.to(setup.dtype).eval()
    max_len = min(setup.talker_context_tokens, config.max_position_embeddings)
    engine = TalkerEngine(model, setup.runner_config(max_len))
    if setup.device.type == "cuda":  # as the Thinker's: compile before serving
        from backends.stages.warmup import talker_request_maker, warm_up

        engine.runner.warm_attention()
        warm_up(engine, "talker", talker_request_maker(config.llm_dim, WARMUP_TEXT_TOKEN), setup.max_sessions)
        log_allocation("talker", setup.device, engine.runner.kv.num_bytes())
    return engine


def build_code2wav_engine(params: dict[str, str], device_id: str = "0") -> Code2WavService:
    from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
    from backends.models.token2wav import load_token2wav
    from backends.models.token2wav.voice_assets import standin_voice_encoder
    from backends.stages.code2wav_engine import DEFAULT_MAX_BATCH, Code2WavEngine
    from backends.stages.voice_cache import DEFAULT_CAPACITY

    setup = StageSetup.from_params(params, device_id)
    ckpt = setup.load()
    if isinstance(ckpt, FullRandomCheckpoint):  # no files: the tiny generator's synthetic voice
        token2wav = ckpt.build_token2wav(setup.device)
        flow = token2wav.config.flow
        token2wav.voice_encoder = standin_voice_encoder(flow.vocab_size, flow.spk_embed_dim,
                                                        "the full-random profile has no checkpoint files")
        audio, rate = synthesize_reference_voice(ckpt.seed), REFERENCE_VOICE_SAMPLE_RATE
    else:  # the checkpoint's voice models when it has them (load_token2wav, voice_assets)
        token2wav = load_token2wav(ckpt.token2wav_dir, setup.device)
        audio, rate = ckpt.reference_voice()
    if setup.dtype != torch.float32:  # the profile's dtype: the flow only, the HiFT stays float32
        token2wav.set_flow_dtype(setup.dtype)
    # the default voice (HT_ref_audio.wav): prompt caches computed once, shared by every stream
    voice = token2wav.voice_from_audio(torch.from_numpy(audio).float(), rate)
    if setup.device.type == "cuda":  # after the one-off prompt pass: graphs for window shapes only
        token2wav.enable_cuda_graphs()
    # session reference voices (REF_AUDIO) are prepared on first use, kept in a bounded LRU
    cache_size = int(params.get("voice_cache_size", str(DEFAULT_CAPACITY)))
    session_voices = params.get("session_voices", "on") == "on"
    max_batch = int(params.get("max_batch", str(DEFAULT_MAX_BATCH)))
    # Estimator caches in one pooled tensor, a slot per live stream, read in place by the DiT
    # (no per-window packing copies); a reply beyond the slots waits for one (Code2WavEngine).
    pool_streams = code2wav_pool_streams(int(params.get("pool_streams", "0") or 0), setup.max_sessions)
    service = Code2WavService(Code2WavEngine(
        token2wav, voice, cache_size, session_voices, max_batch, cache_pool_streams=pool_streams,
        first_window_hold_s=first_window_hold_s(params)))
    if setup.device.type == "cuda":  # every window shape's graphs captured now, not mid-reply
        from backends.stages.warmup import warm_up_code2wav

        warm_up_code2wav(service, setup.max_sessions, max_batch, pool_streams)
        token2wav.seal_hift_graphs()
        log_allocation("code2wav", setup.device, pool_bytes(token2wav.cache_pool))
    return service


def log_allocation(stage: str, device: torch.device, state_bytes: int) -> None:
    """After warm-up: what the stage holds, beside the memory plan's rows logged at render
    (backends/serving/memory_plan.py) so a GPU start shows plan and measurement together. The
    peak then restarts, so the stage's `cuda_peak_allocated_mib` gauge is the serving peak."""
    gib = 1 << 30
    LOG.warning("%s memory after warm-up: state pool %.2f GiB, allocated %.2f GiB, peak %.2f GiB, "
                "reserved %.2f GiB", stage, state_bytes / gib, torch.cuda.memory_allocated(device) / gib,
                torch.cuda.max_memory_allocated(device) / gib, torch.cuda.memory_reserved(device) / gib)
    torch.cuda.reset_peak_memory_stats(device)


def first_window_hold_s(params: dict[str, str]) -> float:
    """Code2Wav's hold for an announced first window: the `first_window_hold_ms` parameter
    (the profile's `code2wav_first_hold_ms`), FIRST_WINDOW_HOLD_S without it."""
    value = params.get("first_window_hold_ms", "")
    try:
        held = FIRST_WINDOW_HOLD_S if value == "" else float(value) / 1000.0
    except ValueError:
        raise ValueError(f"first_window_hold_ms must be a number of ms, got {value!r}") from None
    if not 0.0 <= held <= 1.0:
        raise ValueError(f"first_window_hold_ms must lie in [0, 1000] ms, got {value!r}")
    return held


def pool_bytes(pool: EstimatorPool | None) -> int:
    """Bytes of Code2Wav's pooled estimator caches (0 without a pool)."""
    return 0 if pool is None else pool.att.numel() * pool.att.element_size()
