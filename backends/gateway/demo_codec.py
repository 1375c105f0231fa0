"""The official demo's duplex protocol (`/ws/duplex/{session_id}`), so that its browser app can
be pointed at this server, over the duplex contract. docs/gateway.md tables every message.

Client -> gateway: prepare, audio_chunk, video_frame (refused: no images yet), pause, resume,
stop, client_diagnostic. Gateway -> client: queued, queue_update, queue_done, prepared, result,
paused, resumed, stopped, timeout, error. One `result` per listening unit and per chunk of reply
audio (with the unit's text); the turn's last `result` has end_of_turn. The cost fields are
measured by the gateway: from the moment the unit's audio was complete on the uplink.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from backends.gateway.admission import QueueStatus
from backends.gateway.audio import OUTPUT_FORMAT, AudioDecodeError, float32_base64_to_pcm16, pcm16_to_float32_base64
from backends.gateway.client_fields import config_params, object_field, text_field, voice_audio
from backends.gateway.commands import Append, Close, Command, Ignore, Init, Pause, Resume
from backends.gateway.duplex_stream import DuplexEvent
from backends.gateway.errors import INVALID_AUDIO, UNKNOWN_TYPE, VIDEO_UNSUPPORTED, GatewayError
from backends.gateway.realtime_codec import parse_json
from backends.gateway.session_context import SessionContext
from backends.gateway.usage import CODEC_FRAMES_PER_S

DEMO_SUBPROTOCOL = "minicpmo.duplex"  # only needed to pair with an `apikey.` entry
CONFIG_TO_START = {**{name: name for name in ("temperature", "force_listen_count", "top_k", "top_p",
                                               "max_new_speak_tokens_per_chunk", "listen_prob_scale")},
                   "generate_audio": "tts_enabled"}
VIDEO_MESSAGE = "video frames are not supported by this server: an audio duplex session only"
SIMPLE = {"pause": Pause(), "resume": Resume(), "stop": Close("client"), "client_diagnostic": Ignore()}


class DemoCodec:
    name = "demo"
    errors_end_session = False  # the demo app goes on after an error of one message

    def __init__(self, context: SessionContext, client_id: str) -> None:
        self.context, self.client_id = context, client_id
        self.ticket_id = uuid.uuid4().hex[:12]
        self._told_queued = False
        self._text, self._tokens, self._unit, self._text_at = "", 0, None, 0.0

    def queued(self, status: QueueStatus) -> dict[str, Any]:
        kind = "queue_update" if self._told_queued else "queued"
        self._told_queued = True
        # eta_seconds as the demo's documentation names it, estimated_wait_s as its app reads it
        return {"type": kind, "ticket_id": self.ticket_id, "position": status.position,
                "eta_seconds": status.estimated_wait_s, "estimated_wait_s": status.estimated_wait_s,
                "queue_length": status.queue_length}

    def queue_done(self) -> dict[str, Any]:
        return {"type": "queue_done", "ticket_id": self.ticket_id}

    def paused(self) -> dict[str, Any]:
        return {"type": "paused"}

    def resumed(self) -> dict[str, Any]:
        return {"type": "resumed"}

    def parse(self, data: str) -> Command:
        message = parse_json(data)
        kind = message["type"]
        if kind in SIMPLE:
            return SIMPLE[kind]
        if kind == "prepare":
            return _prepare(message)
        if kind == "video_frame" or (kind == "audio_chunk" and message.get("frame_base64_list")):
            raise GatewayError(VIDEO_UNSUPPORTED, VIDEO_MESSAGE)
        if kind == "audio_chunk":
            return _audio_chunk(message)
        raise GatewayError(UNKNOWN_TYPE, f"unknown message type {kind!r}")

    def error(self, code: str, message: str) -> dict[str, Any]:
        # `error`: the text as the demo's app reads it
        return {"type": "error", "code": code, "message": message, "error": f"[{code}] {message}"}

    def closed(self, reason: str) -> list[dict[str, Any]]:
        if reason == "timeout":
            return [{"type": "timeout", "session_id": self.client_id}]
        return [{"type": "stopped", "session_id": self.client_id, "reason": reason,
                 "usage": self.context.usage.as_json()}]

    def events(self, event: DuplexEvent) -> list[dict[str, Any]]:
        fields = event.fields
        if event.type == "session.created":
            return [{"type": "prepared", "session_id": self.client_id, "output_audio": OUTPUT_FORMAT,
                     "config_not_applied": list(self.context.not_applied)}]
        if event.type == "response.listen":
            return [self._result(True, "", "", unit=fields.get("unit_index"))]
        if event.type == "response.text.delta":
            self._text += str(fields.get("text", ""))
            self._tokens += fields.get("n_tokens", 0) if isinstance(fields.get("n_tokens"), int) else 0
            self._unit, self._text_at = fields.get("unit_index"), time.monotonic()
            return []
        if event.type == "response.audio.delta" and event.audio is not None:
            return [self._result(False, self._take_text(), pcm16_to_float32_base64(event.audio),
                                 unit=self._unit, tts_tokens=event.audio.size * CODEC_FRAMES_PER_S // 24000)]
        if event.type == "response.done":
            return [self._result(False, self._take_text(), "", unit=self._unit, end_of_turn=True)]
        if event.type == "error":
            return [self.error(str(fields.get("code", "error")), str(fields.get("message", "")))]
        return []

    def _take_text(self) -> str:
        text, self._text = self._text, ""
        return text

    def _result(self, is_listen: bool, text: str, audio: str, unit: object, end_of_turn: bool = False,
                tts_tokens: int = 0) -> dict[str, Any]:
        tokens, self._tokens = self._tokens, 0
        all_ms = self.context.clock.since_unit_ms(unit)
        tts_ms = round(1000.0 * (time.monotonic() - self._text_at), 1) if audio else 0.0
        return {"type": "result", "is_listen": is_listen, "text": text, "audio_data": audio,
                "end_of_turn": end_of_turn, "current_time": self.context.clock.audio_ms,
                "cost_llm_ms": round(max(all_ms - tts_ms, 0.0), 1), "cost_tts_ms": tts_ms, "cost_all_ms": all_ms,
                "n_tokens": tokens, "n_tts_tokens": int(tts_tokens), "server_send_ts": time.time()}


def _audio_chunk(message: dict[str, Any]) -> Append:
    """`audio` as the demo's documentation names it, `audio_base64` as its app sends it;
    `force_listen` (the app's interrupt) is a barge-in."""
    audio = message.get("audio", message.get("audio_base64"))
    try:
        return Append(float32_base64_to_pcm16(audio), interrupt=bool(message.get("force_listen")))
    except AudioDecodeError as err:
        raise GatewayError(INVALID_AUDIO, str(err)) from None


def _prepare(message: dict[str, Any]) -> Init:
    params, not_applied = config_params(object_field(message, "config"), CONFIG_TO_START)
    prompt = text_field(message, "prefix_system_prompt", "system_prompt")
    if prompt is not None:
        params["instructions"] = prompt
    ref_audio, voice_not_applied = voice_audio(message.get("ref_audio_base64"), message.get("tts_ref_audio_base64"))
    extra = ("ref_audio_path",) if message.get("ref_audio_path") else ()
    return Init(params, ref_audio, not_applied + voice_not_applied + extra)
