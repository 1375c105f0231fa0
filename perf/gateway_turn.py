"""One benchmark turn through the WebSocket gateway (`duplex_bench --via gateway`): the same
session as perf/turn.py's (initial_user_text, the group's voice, the forced reply shape, silence
in real time until response.done), spoken over the Realtime protocol at /v1/realtime, measured
into the same TurnRecord so that both paths land in one report."""
from __future__ import annotations

import base64
import json
import time

import numpy as np
from websockets.sync.client import connect

from client.metrics import ChunkArrival, SessionReport, TurnTimeline, compute_turn_metrics
from perf.turn import TurnOptions, TurnRecord, UnitEvent
from perf.workload import TurnSpec

MODEL_NAME = "minicpm-o-4.5"


def _b64(pcm16: np.ndarray) -> str:
    return base64.b64encode((pcm16.astype("<f4") / 32768.0).tobytes()).decode()


def _init(spec: TurnSpec, voice: np.ndarray, options: TurnOptions) -> str:
    params = {"initial_user_text": spec.text, "seed": spec.seed, "reply_units": spec.reply_units,
              "reply_tokens_per_unit": spec.tokens_per_unit}
    payload = {"duplex_params": params, "voice": {"ref_audio_base64": _b64(voice)}}
    if options.temperature is not None:
        payload["config"] = {"temperature": options.temperature}
    if options.instructions:
        payload["system_prompt"] = options.instructions
    return json.dumps({"type": "session.init", "payload": payload})


class _Turn:
    """The client's view of one gateway session, as raw timestamps."""

    def __init__(self) -> None:
        self.start_s: float | None = None
        self.first_text_s = self.ttft = self.ttfp = self.status = None
        self.chunks: list[ChunkArrival] = []
        self.events: list[UnitEvent] = []
        self.errors: list[str] = []
        self.appends: list[float] = []

    def on(self, event: dict, now: float) -> bool:
        """Record one event; True once the reply is done."""
        kind = event.get("type")
        if kind == "response.output_text.delta" and event.get("text"):
            self.first_text_s = self.first_text_s or now
            self.ttft = self.ttft if self.ttft is not None else event.get("ttft_ms")
            self.events.append(UnitEvent("text", None, now, event["text"]))
        elif kind == "response.output_audio.delta":
            samples = len(base64.b64decode(event["audio"])) // 4
            self.chunks.append(ChunkArrival(now, samples))
            self.ttfp = self.ttfp if self.ttfp is not None else event.get("ttfp_ms")
            self.events.append(UnitEvent("audio", None, now))
        elif kind == "error":
            self.errors.append(f"{event['error']['code']}: {event['error']['message']}")
        elif kind == "response.done":
            self.status = event["response"]["status"]
        return kind in ("response.done", "error", "session.closed")


def run_gateway_turn(spec: TurnSpec, voice: np.ndarray, options: TurnOptions, run_id: str) -> TurnRecord:
    started, turn, closed = time.monotonic(), _Turn(), False
    url = f"{options.gateway_url}/v1/realtime?mode=audio&model={MODEL_NAME}"
    try:
        with connect(url, subprotocols=["map.realtime"], max_size=None, open_timeout=options.open_retry_s) as ws:
            session_id = _open(ws, spec, voice, options)
            _stream(ws, turn, options)
            ws.send(json.dumps({"type": "session.close"}))
            closed = _wait_closed(ws, options.close_timeout_s)
    except Exception as exc:  # noqa: BLE001 - a failed turn, counted like any other
        session_id = run_id
        turn.errors.append(f"{type(exc).__name__}: {exc}")
    return _record(spec, session_id, turn, started, closed, options)


def _open(ws, spec: TurnSpec, voice: np.ndarray, options: TurnOptions) -> str:
    while json.loads(ws.recv(options.open_retry_s))["type"] != "session.queue_done":
        pass
    ws.send(_init(spec, voice, options))
    event = json.loads(ws.recv(options.created_timeout_s))
    if event["type"] != "session.created":
        raise RuntimeError(f"no session: {event}")
    return event["session_id"]


def _stream(ws, turn: _Turn, options: TurnOptions) -> None:
    """Silence on absolute deadlines; events read while waiting for the next one."""
    samples = 16 * options.append_ms
    silence = json.dumps({"type": "input.append", "input": {"audio": _b64(np.zeros(samples, np.int16))}})
    turn.start_s = t0 = time.monotonic()
    for k in range(int(options.max_silence_s * 1000 // options.append_ms)):
        ws.send(silence)
        turn.appends.append(time.monotonic())
        deadline = t0 + (k + 1) * options.append_ms / 1000.0
        while (left := deadline - time.monotonic()) > 0:
            try:
                raw = ws.recv(left)
            except TimeoutError:
                break
            if turn.on(json.loads(raw), time.monotonic()):
                return


def _wait_closed(ws, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if json.loads(ws.recv(deadline - time.monotonic()))["type"] == "session.closed":
            return True
    return False


def _record(spec: TurnSpec, session_id: str, turn: _Turn, started: float, closed: bool,
            options: TurnOptions) -> TurnRecord:
    timeline = TurnTimeline("r0", turn.start_s or started, turn.status, turn.first_text_s, turn.ttft, turn.ttfp,
                            tuple(turn.chunks))
    metrics = (compute_turn_metrics(timeline, 0),) if turn.status is not None else ()
    audio_ms = sum(chunk.num_samples for chunk in turn.chunks) / 24.0
    report = SessionReport(session_id, metrics, tuple(turn.errors), 0.0, len(turn.appends) * options.append_ms,
                           audio_ms, time.monotonic() - started, closed)
    return TurnRecord(spec, session_id, report, 0, tuple(turn.appends), tuple(turn.events))
