"""Audio-tail benchmark: Talker time to 25 frames and Code2Wav time per window, at
batch 1, 4, 8 and 16, CUDA graphs on and off, with peak memory; full dimensions, random weights.

Talker: B requests each get one mid-turn condition (10 handed tokens with 4096-wide hidden
rows; the mid-turn budget yields exactly 25 frames), submitted together; the time is from the
submits to the last request's 25th frame, through `TalkerEngine.step` (prefill + 25 decode
steps). Graphs on/off = the runner's fast path with or without its decode graphs. The chunk
policy runs on the device (`--talker-policy device`, the engine's default on the fast path:
policy, draw and policy update inside the decode step's sampling graph) or as the host hook
(`--talker-policy host`: each Talker row's logits copied to the host and sampled there; the
mode column then says "+host-policy").
Code2Wav: B streams of one 6 s voice (P = 300 prompt frames) brought to steady state (caches at
P + 100), then each `Token2Wav.decode` of B 28-code windows (encoder, 10 CFM steps with CFG,
HiFT, cross-fade; 24000 samples per stream) is timed to the audio on the host. The flow part
(encoder + CFM) is timed separately. float32 as the reference's default (`float16=False`).

  python perf/bench_audio_tail.py --out perf/out/audio_tail.md --commit <sha>
  python perf/bench_audio_tail.py --stages talker --talker-policy host   # the host hook
  python perf/bench_audio_tail.py --tiny --device cpu --batches 1,2   # smoke run on CPU
  python perf/bench_audio_tail.py --stages code2wav --repeats 3 --code2wav-modes fusion
      # bf16 + graphs with the DiT's fused kernels and the encoder graph each on and off
"""
from __future__ import annotations

import argparse
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
from backends.contracts.messages import TalkerRequest
from backends.contracts.sink import ListSink
from backends.models.talker import TalkerConfig, TalkerModel
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig
from backends.models.token2wav.assets import random_token2wav
from backends.runner.types import RunnerConfig
from backends.stages.talker_engine import TalkerEngine
from perf.switches import active_switches

HANDED_TOKENS = 10
FRAMES = 25
WINDOW_CODES = 28
STEADY_WINDOWS = 3  # after these a stream's caches sit at prompt + 100 frames
MAX_STEPS = 200  # a Talker run that needs more has failed (budget: 26 samples)
# ms: the audio tail's latency budget per step (a Talker chunk, a Code2Wav window) by batch
TARGETS = {"talker": {1: 15.0, 16: 25.0}, "code2wav": {1: 10.0, 16: 40.0}}


# graphs on/off, then options: +tf32 (TF32 matmuls), +bf16 (flow dtype), +unfused (the DiT's
# torch path instead of its fused Triton kernels), +eagerenc (no encoder graph)
CODE2WAV_MODES = ("off", "on", "on+tf32", "on+bf16")
FUSION_MODES = ("on+bf16+unfused+eagerenc", "on+bf16+unfused", "on+bf16+eagerenc", "on+bf16")


@dataclass(frozen=True, slots=True)
class Row:
    stage: str
    batch: int
    mode: str  # "off" / "on" (CUDA graphs), optionally "+tf32" or "+bf16" (Code2Wav flow)
    median_ms: float | None
    extra: str  # component split or the failure
    peak_gib: float | None


def timed(run: Callable[[], None], repeats: int, device: torch.device, idle_s: float = 0.0) -> float:
    """Median wall time in ms of `run` (synchronised before and after), each run after the
    device and this thread idled `idle_s` seconds."""
    samples = []
    for _ in range(repeats):
        _sync(device)
        time.sleep(idle_s)
        start = time.perf_counter()
        run()
        _sync(device)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# -- Talker -------------------------------------------------------------------------------------


def talker_model(tiny: bool, device: torch.device, dtype: torch.dtype) -> TalkerModel:
    config = TalkerConfig(llm_dim=64, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=4, num_hidden_layers=2, num_text_tokens=1000,
                          audio_bos_token_id=5, text_eos_token_id=6) if tiny else TalkerConfig()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = TalkerModel(config)
        for name, param in model.named_parameters():  # checkpoint-like scale: logits stay sane
            torch.nn.init.normal_(param, 0.0, 0.02) if param.dim() > 1 else torch.nn.init.ones_(param)
    return model.to(dtype).eval()


def bench_talker(model: TalkerModel, batch: int, graphs: bool, repeats: int,
                 device: torch.device, dtype: torch.dtype, policy: str = "device",
                 chains: tuple[int, ...] | None = None) -> Row:
    _reset_peak(device)
    context = 4096 if device.type == "cuda" else 256
    config = RunnerConfig(num_blocks=(batch + 2) * context // 16, max_num_reqs=batch + 2,
                          max_model_len=context, device=str(device), dtype=dtype,
                          attention_backend="triton" if device.type == "cuda" else "reference",
                          use_cuda_graphs=graphs,
                          gemv_backend="triton" if device.type == "cuda" else "cublas")
    # On the CPU reference path the policy is always the host hook (no device sampler there).
    engine = TalkerEngine(model, config, device_policy=policy == "device" and config.is_fast_path,
                          chain_lengths=chains)
    counter = iter(range(1_000_000))
    inputs = condition_inputs(model.config, batch)  # made once, outside the timing

    def run() -> None:
        ids = [f"r{next(counter)}" for _ in range(batch)]
        sinks = [submit_condition(engine, rid, *handoff) for rid, handoff in zip(ids, inputs)]
        for _ in range(MAX_STEPS):
            if all(_frames(sink) >= FRAMES for sink in sinks):
                break
            failed = [sink.error for sink in sinks if sink.closed and _frames(sink) < FRAMES]
            if failed:
                raise RuntimeError(f"a condition ended early: {failed[0]}")
            engine.step()
        else:
            raise RuntimeError(f"no {FRAMES} frames after {MAX_STEPS} steps")
        for request_id in ids:
            engine.stop(request_id)

    run()  # warm-up: kernels, graph capture
    median = timed(run, repeats, device)
    mode = ("on" if graphs else "off") + ("+host-policy" if policy == "host" else "")
    mode += "" if chains is None else "+chains=" + "/".join(map(str, chains))
    return Row("talker", batch, mode, median, "", _peak_gib(device))


def condition_inputs(config: TalkerConfig, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """B mid-turn handoffs (10 Thinker token ids and their hidden rows) made before any timing:
    a server receives them made, so drawing 16 x 10 x 4096 normals (~13 ms) is not Talker time."""
    rng = np.random.default_rng(batch)
    return [(rng.integers(0, config.num_text_tokens, HANDED_TOKENS).astype(np.int32),
             rng.standard_normal((HANDED_TOKENS, config.llm_dim)).astype(np.float32))
            for _ in range(batch)]  # fmt: skip


def submit_condition(engine: TalkerEngine, request_id: str, token_ids: np.ndarray,
                     hidden: np.ndarray) -> ListSink:  # fmt: skip
    sink = ListSink()
    engine.submit(TalkerRequest(request_id=request_id, condition_seq=0, token_ids=token_ids,
                                hidden=hidden), sink)  # fmt: skip
    return sink


def _frames(sink: ListSink) -> int:
    return sum(len(group.codes) for group in sink.results)


# -- Code2Wav -----------------------------------------------------------------------------------


def code2wav_model(tiny: bool, device: torch.device) -> Token2Wav:
    config = Token2WavConfig.tiny() if tiny else Token2WavConfig()
    return random_token2wav(config, seed=0).to(device)


def bench_code2wav(model: Token2Wav, batch: int, mode: str, repeats: int,
                   device: torch.device, idle_s: float = 0.0) -> Row:
    _reset_peak(device)
    options = set(mode.split("+")[1:])
    if mode.startswith("on"):
        model.enable_cuda_graphs(encoder="eagerenc" not in options)
    else:
        model.disable_cuda_graphs()
    model.set_fused_kernels(False if "unfused" in options else None)
    model.set_flow_dtype(torch.bfloat16 if "bf16" in options else torch.float32)
    if "pool" in options:  # after the dtype: the pool is allocated in the flow's dtype
        model.enable_cache_pool(batch)
    else:
        model.disable_cache_pool()
    torch.backends.cuda.matmul.allow_tf32 = "tf32" in options
    audio = torch.from_numpy(synthesize_reference_voice(0)).float()
    voice = model.voice_from_audio(audio, REFERENCE_VOICE_SAMPLE_RATE)
    streams = [model.new_stream(voice) for _ in range(batch)]
    rng = np.random.default_rng(batch)

    def window() -> None:
        codes = rng.integers(0, 6561, (batch, WINDOW_CODES)).astype(np.int32)
        model.decode([StreamWindow(s, codes[b], False) for b, s in enumerate(streams)])

    for _ in range(STEADY_WINDOWS + 2):  # steady caches; graphs captured
        window()
    median = timed(window, repeats, device, idle_s)
    encoder = _encoder_ms(model, streams, rng, repeats, device, idle_s)
    flow = _flow_ms(model, streams, rng, repeats, device, idle_s)
    torch.backends.cuda.matmul.allow_tf32 = False
    split = f"encoder {encoder:.1f}, CFM + caches {flow - encoder:.1f}, HiFT + rest {median - flow:.1f}"
    if idle_s:
        split = f"each after {idle_s:g} s idle: {split}"
    return Row("code2wav", batch, mode, median, split, _peak_gib(device))


def _encoder_ms(model: Token2Wav, streams: list, rng: np.random.Generator, repeats: int,
                device: torch.device, idle_s: float = 0.0) -> float:
    """The Conformer encoder (with the code embedding and `encoder_proj`) alone over the
    streams' current caches."""
    def encode() -> None:  # through `flow.encoder_runner`: graphed unless the mode says +eagerenc
        codes = rng.integers(0, 6561, (len(streams), WINDOW_CODES))
        with torch.inference_mode():
            _, _, grow = model.flow.encoder.launch_chunk(
                codes, [WINDOW_CODES] * len(streams), [False] * len(streams),
                [s.flow_cache.encoder for s in streams], model.flow.encoder_runner)
            grow()

    return timed(encode, repeats, device, idle_s)


def _flow_ms(model: Token2Wav, streams: list, rng: np.random.Generator, repeats: int,
             device: torch.device, idle_s: float = 0.0) -> float:
    """Encoder + CFM (with packing and cache cuts) of one steady window per stream."""
    def flow() -> None:
        codes = rng.integers(0, 6561, (len(streams), WINDOW_CODES)).astype(np.int32)
        with torch.inference_mode():
            _, _, settle = model._run_flow(
                [StreamWindow(s, codes[b], False) for b, s in enumerate(streams)])
            settle()

    return timed(flow, repeats, device, idle_s)


# -- report -------------------------------------------------------------------------------------


def guarded(bench: Callable[[], Row], stage: str, batch: int, mode: str) -> Row:
    try:
        return bench()
    except Exception as exc:  # one failing configuration must not lose the others
        traceback.print_exc()
        return Row(stage, batch, mode, None, f"failed: {type(exc).__name__}: {exc}"[:200], None)


def render(rows: list[Row], args: argparse.Namespace, device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [
        "# Audio tail on one GPU: Talker time to 25 frames, Code2Wav time per window",
        "",
        f"- device: {name}; torch {torch.__version__}; profile: {'tiny' if args.tiny else 'full dimensions'}, random weights",
        f"- commit: {args.commit}",
        f"- command: `{args.command}`",
        f"- switches: {active_switches()}",
        f"- Talker: bf16 on GPU, fast path (Triton attention); Code2Wav: float32 unless the mode says"
        f" +tf32 (TF32 matmuls) or +bf16 (flow in bfloat16, HiFT float32); median of {args.repeats} runs",
        f"- Talker chunk policy: {args.talker_policy} (host hook off the runner's fast path)",
        "- targets: Talker <= 15 ms at batch 1, <= 25 ms at 16; Code2Wav <= 10 ms at batch 1, <= 40 ms at 16",
        "",
        "| stage | batch | CUDA graphs | median ms | per-stream ms | split (ms) / note | peak GiB |",
        "| --- | ---: | --- | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        ms = "n/a" if row.median_ms is None else f"{row.median_ms:.1f}"
        per = "n/a" if row.median_ms is None else f"{row.median_ms / row.batch:.2f}"
        peak = "n/a" if row.peak_gib is None else f"{row.peak_gib:.2f}"
        lines.append(f"| {row.stage} | {row.batch} | {row.mode} | {ms} | {per} | {row.extra} | {peak} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions (CPU smoke run)")
    parser.add_argument("--stages", default="talker,code2wav")
    parser.add_argument("--code2wav-modes", default=",".join(CODE2WAV_MODES),
                        help="comma list; 'fusion' = " + ",".join(FUSION_MODES))
    parser.add_argument("--talker-policy", default="device", choices=("device", "host"),
                        help="Talker chunk policy: device tables (default) or the host hook")
    parser.add_argument("--talker-chains", default=None,
                        help="decode chain lengths, e.g. 24,8 (default: the engine's choice)")
    parser.add_argument("--idle-s", type=float, default=0.0,
                        help="Code2Wav: time each window after the GPU idled this long (served "
                             "windows of one stream come ~1 s apart)")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.command = "python perf/bench_audio_tail.py " + " ".join(
        f"--{k} {v}" for k, v in (("batches", args.batches), ("repeats", args.repeats),
                                  ("stages", args.stages), ("code2wav-modes", args.code2wav_modes),
                                  ("talker-policy", args.talker_policy),
                                  ("idle-s", args.idle_s)))
    device = torch.device(args.device)
    batches = [int(b) for b in args.batches.split(",")]
    if args.code2wav_modes == "fusion":
        args.code2wav_modes = ",".join(FUSION_MODES)
    rows: list[Row] = []
    run_all(args, device, batches, lambda row: _record(rows, row, args, device))
    print(render(rows, args, device))
    return 0


def _record(rows: list[Row], row: Row, args: argparse.Namespace, device: torch.device) -> None:
    """Keep the row and rewrite the report, so a run cut short still leaves its results."""
    rows.append(row)
    print(row, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(rows, args, device))


def run_all(args: argparse.Namespace, device: torch.device, batches: list[int],
            record: Callable[[Row], None]) -> None:
    torch.set_grad_enabled(False)
    stages = args.stages.split(",")
    if "talker" in stages:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = talker_model(args.tiny, device, dtype)
        for graphs in (False, True):
            for batch in batches:
                record(guarded(lambda: bench_talker(model, batch, graphs, args.repeats, device, dtype,
                                                    args.talker_policy, _chains(args.talker_chains)),
                               "talker", batch, "on" if graphs else "off"))
        del model
    if "code2wav" in stages:
        model = code2wav_model(args.tiny, device)
        for mode in args.code2wav_modes.split(","):  # bf16 last: it rounds the weights
            for batch in batches:
                record(guarded(lambda: bench_code2wav(model, batch, mode, args.repeats, device, args.idle_s),
                               "code2wav", batch, mode))


def _chains(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(n) for n in text.split(",") if n)


if __name__ == "__main__":
    raise SystemExit(main())
