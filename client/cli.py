"""`minicpmo-client`: stream an audio file (or, with --mic, the microphone) to the `duplex`
model in real time, print the events and per-turn latencies, and save the spoken reply (24 kHz
mono PCM16; with --mic it also plays as it arrives).

Exit codes: 0 success; 1 an error event, a failed request, a timeout or no reply audio;
2 bad arguments, an unreadable input file, or no audio device for --mic.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from client.errors import DuplexStreamError
from client.events import (
    AudioDelta,
    DuplexEvent,
    ErrorEvent,
    RequestFailed,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    TextDelta,
)
from client.live import NoAudioDevice, open_audio, stream_live
from client.metrics import OUTPUT_SAMPLE_RATE, SessionReport, TurnMetrics
from client.params import SessionParams
from client.resample import UPLINK_SAMPLE_RATE, to_uplink_pcm
from client.session import AFFINITY_HEADER, MODEL_NAME, DuplexSession
from client.streaming import StreamConfig, stream_utterance
from client.url import grpc_target
from client.wav import WavAudio, read_wav, write_wav

DEFAULT_INPUT = Path(__file__).resolve().parent / "data" / "hello_16k.wav"
NON_SILENT_PEAK = 64  # |sample| above which the reply counts as audible (about -54 dBFS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minicpmo-client", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--url", default="127.0.0.1:8001", help="Triton gRPC address: host:port or http://host:port")
    add("--model", default=MODEL_NAME, help="model name on the server")
    add("--input", type=Path, default=DEFAULT_INPUT,
        help="audio file: wav of any sample format, FLAC, OGG, ... (resampled to 16 kHz mono)")
    add("--mic", action="store_true",
        help="live: stream the default microphone and play the reply on the default speaker "
             "until Ctrl-C or --max-seconds (needs PortAudio and both devices)")
    add("--output", type=Path, default=Path("reply.wav"),
        help="where to write the reply audio (PCM16; .wav, .flac, ... by the extension)")
    add("--json", type=Path, default=None, help="write the session report as JSON here")
    add("--session-id", default=None, help="sequence id of the session (default: random)")
    add("--affinity-header", default=None, metavar="NAME",
        help=f"send the session id in this gRPC header for a load balancer's session affinity "
             f"(e.g. {AFFINITY_HEADER})")
    add("--instructions", default=None, help="system prompt")
    add("--initial-user-text", default=None, help="open the session with this user text")
    add("--temperature", type=float, default=None, help="text sampling temperature (0: greedy)")
    add("--top-k", type=int, default=None)
    add("--top-p", type=float, default=None)
    add("--max-new-speak-tokens-per-chunk", type=int, default=None, help="most tokens of one unit")
    add("--listen-prob-scale", type=float, default=None)
    add("--length-penalty", type=float, default=None, help="on <|turn_eos|>: > 1 makes replies longer")
    add("--text-repetition-penalty", type=float, default=None)
    add("--text-repetition-window-size", type=int, default=None)
    add("--listen-when-silent", action=argparse.BooleanOptionalAction, default=None,
        help="listen on silent units with nothing to answer (default: the server's)")
    add("--sliding-window-mode", choices=("off", "basic", "context"), default=None,
        help="when the Thinker's context fills: end (off), drop the oldest units (basic), or keep "
             "recent units and the dropped text (context); default: the server's")
    add("--max-kv-tokens", type=int, default=None,
        help="the session's Thinker context in tokens (at most the server's max_context_tokens)")
    add("--tts", dest="tts_enabled", action=argparse.BooleanOptionalAction, default=None,
        help="spoken replies (default); --no-tts: text only")
    add("--max-reply-tokens", type=int, default=None, help="end each reply after N text tokens")
    add("--seed", type=int, default=None)
    add("--reply-units", type=int, default=None, help="force replies of N 1-second units")
    add("--reply-tokens-per-unit", type=int, default=None, help="force N text tokens per unit")
    add("--voice", default=None, help="server-side voice name")
    add("--force-listen-count", type=int, default=None, help="force N listen units per turn")
    add("--ref-audio", type=Path, default=None, help="audio file of a voice clip (REF_AUDIO)")
    add("--speed", type=float, default=1.0,
        help="pacing factor; 2.0 = twice real time (the server refuses appends once a session "
             "would run more than max_uplink_ahead_s, 5 s by default, ahead of real time)")
    add("--max-seconds", type=float, default=60.0,
        help="most silence streamed awaiting a reply; with --mic, the longest session")
    add("--timeout", type=float, default=30.0, help="seconds to wait for the server at each step")
    add("--quiet", action="store_true", help="do not print every event")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        url = grpc_target(args.url)
        params, config = _params(args), _config(args)
        if args.mic:
            return _main_live(args, url, params, config)
        pcm16 = _load_uplink(args.input, "input")
        ref_audio = _load_uplink(args.ref_audio, "ref-audio") if args.ref_audio else None
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with _connect(args, url) as session:
        if not _ready(session, args.timeout, url):
            return 1
        print(f"session {session.session_id}: streaming {args.input} to {url}")
        report = stream_utterance(session, pcm16, params, config, ref_audio=ref_audio, on_event=_printer(args))
        reply = session.reply_audio()
    return _conclude(report, reply, args)


def _main_live(args: argparse.Namespace, url: str, params: SessionParams, config: StreamConfig) -> int:
    """--mic: the default microphone to the session, the reply to the default speaker, until
    Ctrl-C or --max-seconds; exit 2 with what is missing where there is no audio device."""
    try:
        mic, speaker = open_audio(config.append_ms)
    except NoAudioDevice as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    try:
        with _connect(args, url) as session, mic, speaker:
            if not _ready(session, args.timeout, url):
                return 1
            print(f"session {session.session_id}: live from the microphone to {url}; Ctrl-C ends it")
            report = stream_live(session, mic, speaker, params, config, should_stop=stop.is_set,
                                 on_event=_printer(args))
            reply = session.reply_audio()
    except NoAudioDevice as exc:  # a device that opened but would not start
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGINT, previous)
    return _conclude(report, reply, args)


def _connect(args: argparse.Namespace, url: str) -> DuplexSession:
    affinity = {"affinity_header": args.affinity_header} if args.affinity_header else {}
    return DuplexSession.connect(url, args.session_id, model_name=args.model, **affinity)


def _ready(session: DuplexSession, timeout_s: float, url: str) -> bool:
    try:
        session.check_ready(timeout_s)
    except DuplexStreamError as exc:
        print(f"error: {exc} (url {url})", file=sys.stderr)
        return False
    return True


def _printer(args: argparse.Namespace) -> "_EventPrinter | None":
    return None if args.quiet else _EventPrinter(time.monotonic())


def _conclude(report: SessionReport, reply: np.ndarray, args: argparse.Namespace) -> int:
    """Print the report, save the reply (and the JSON report); the exit code."""
    _print_report(report)
    _save_reply(reply, args.output)
    if args.json is not None:
        args.json.write_text(report.to_json() + "\n")
        print(f"report: {args.json}")
    return 0 if report.ok else 1


def _params(args: argparse.Namespace) -> SessionParams:
    return SessionParams(
        instructions=args.instructions,
        initial_user_text=args.initial_user_text,
        temperature=args.temperature,
        seed=args.seed,
        reply_units=args.reply_units,
        reply_tokens_per_unit=args.reply_tokens_per_unit,
        voice=args.voice,
        force_listen_count=args.force_listen_count,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_speak_tokens_per_chunk=args.max_new_speak_tokens_per_chunk,
        listen_prob_scale=args.listen_prob_scale,
        length_penalty=args.length_penalty,
        text_repetition_penalty=args.text_repetition_penalty,
        text_repetition_window_size=args.text_repetition_window_size,
        listen_when_silent=args.listen_when_silent,
        sliding_window_mode=args.sliding_window_mode,
        max_kv_tokens=args.max_kv_tokens,
        tts_enabled=args.tts_enabled,
        max_reply_tokens=args.max_reply_tokens,
    )


def _config(args: argparse.Namespace) -> StreamConfig:
    return StreamConfig(
        speed=args.speed,
        max_seconds=args.max_seconds,
        created_timeout_s=args.timeout,
        close_timeout_s=args.timeout,
    )


def _load_uplink(path: Path, what: str) -> np.ndarray:
    audio: WavAudio = read_wav(path)
    if audio.sample_rate != UPLINK_SAMPLE_RATE or audio.num_channels != 1:
        print(
            f"{what}: {audio.sample_rate} Hz x {audio.num_channels} channels,"
            f" resampled to {UPLINK_SAMPLE_RATE} Hz mono (soxr, anti-aliased)"
        )
    return to_uplink_pcm(audio)


class _EventPrinter:
    """Prints one concise line per event, timed from when streaming began."""

    def __init__(self, t0_s: float):
        self._t0_s = t0_s

    def __call__(self, event: DuplexEvent) -> None:
        print(f"[{event.received_s - self._t0_s:8.3f}s] {describe_event(event)}")


def describe_event(event: DuplexEvent) -> str:
    if isinstance(event, AudioDelta):
        ttfp = "" if event.ttfp_ms is None else f" ttfp={event.ttfp_ms:.0f}ms"
        chunk_ms = event.audio.shape[0] * 1000.0 / OUTPUT_SAMPLE_RATE
        return (
            f"{event.type} resp={event.response_id} turn={event.turn_id} +{chunk_ms:.0f}ms"
            f" (total {event.audio_ms:.0f}ms){ttfp} text={event.text!r}"
        )
    if isinstance(event, TextDelta):
        ttft = "" if event.ttft_ms is None else f" ttft={event.ttft_ms:.0f}ms"
        return f"{event.type} resp={event.response_id}{ttft} text={event.text!r}"
    if isinstance(event, ResponseCreated):
        return f"{event.type} resp={event.response_id} turn={event.turn_id}"
    if isinstance(event, ResponseDone):
        return f"{event.type} resp={event.response_id} status={event.status}"
    if isinstance(event, ErrorEvent):
        return f"{event.type} {event.code}: {event.message}"
    if isinstance(event, RequestFailed):
        return f"request failed: {event.message}"
    if isinstance(event, SessionClosed) and event.reason:
        return f"{event.type} reason={event.reason}"
    return event.type


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def describe_turn(turn: TurnMetrics) -> str:
    rtf = "n/a" if turn.rtf is None else f"{turn.rtf:.2f}"
    return (
        f"turn {turn.turn_index} resp={turn.response_id} status={turn.status}"
        f" audio={turn.audio_ms:.0f} ms in {turn.num_chunks} chunks\n"
        f"  TTFT client {_ms(turn.client_ttft_ms)}, server {_ms(turn.server_ttft_ms)}"
        f" | TTFP client {_ms(turn.client_ttfp_ms)}, server {_ms(turn.server_ttfp_ms)}"
        f" | RTF {rtf}\n"
        f"  max inter-chunk gap {_ms(turn.max_inter_chunk_gap_ms)} | playback stalls"
        f" {len(turn.playback_stalls_ms)}, underruns {turn.num_underruns}"
        f" ({turn.underrun_ms:.0f} ms)"
    )


def _print_report(report: SessionReport) -> None:
    for turn in report.turns:
        print(describe_turn(turn))
    mean_rtf = "n/a" if report.mean_rtf is None else f"{report.mean_rtf:.2f}"
    print(
        f"session {report.session_id}: {len(report.turns)} turn(s), mean RTF {mean_rtf},"
        f" input {report.input_ms / 1000:.1f} s + silence {report.silence_ms / 1000:.1f} s,"
        f" wall {report.wall_s:.1f} s, closed cleanly: {'yes' if report.closed_cleanly else 'no'}"
    )
    for error in report.errors:
        print(f"error: {error}")


def _save_reply(reply: np.ndarray, path: Path) -> None:
    if reply.shape[0] == 0:
        print("reply: no audio received")
        return
    write_wav(path, reply, OUTPUT_SAMPLE_RATE)
    peak = int(np.abs(reply.astype(np.int32)).max())
    audible = "yes" if peak > NON_SILENT_PEAK else "NO (silent)"
    print(
        f"reply: {path} ({reply.shape[0] / OUTPUT_SAMPLE_RATE:.2f} s at {OUTPUT_SAMPLE_RATE} Hz,"
        f" peak {peak}, non-silent: {audible})"
    )
