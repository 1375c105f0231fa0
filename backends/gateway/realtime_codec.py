"""MiniCPM-o Realtime V1 (`/v1/realtime`, subprotocol `map.realtime`), as the openbmb-realtime
SDK speaks it, over the duplex contract. docs/gateway.md tables every event and field.

Client -> gateway: session.init, input.append, session.close. Gateway -> client:
session.queued, session.queue_done, session.created, response.output_text.delta,
response.output_audio.delta (base64 float32 24 kHz mono), response.listen, response.done,
usage, error, session.closed. The SDK treats every `error` as the end of its session, so an
error ends the session here too.
"""
from __future__ import annotations

import json
from typing import Any

from backends.gateway.admission import QueueStatus
from backends.gateway.audio import OUTPUT_FORMAT, AudioDecodeError, float32_base64_to_pcm16, pcm16_to_float32_base64
from backends.gateway.client_fields import config_params, object_field, start_params, text_field, voice_audio
from backends.gateway.commands import Append, Close, Command, Init
from backends.gateway.duplex_stream import DuplexEvent
from backends.gateway.errors import (
    BAD_JSON, INVALID_AUDIO, INVALID_EVENT, UNKNOWN_TYPE, VIDEO_UNSUPPORTED, GatewayError,
)
from backends.gateway.session_context import SessionContext

SUBPROTOCOL = "map.realtime"
CONFIG_TO_START = {**{name: name for name in ("temperature", "length_penalty", "max_kv_tokens", "tts_enabled")},
                   "max_tokens": "max_reply_tokens"}
# An extension of session.init's payload: START parameters of the duplex contract passed as they
# are (the server validates them), for clients that need more than the SDK's fields.
DUPLEX_PARAMS = "duplex_params"
# Video needs a server that sees images; until then a video session is refused with this code.
VIDEO_MESSAGE = "video input is not supported by this server: use mode=audio"


def parse_json(data: str) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise GatewayError(BAD_JSON, f"not JSON: {err}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise GatewayError(INVALID_EVENT, "a message is a JSON object with a string `type`")
    return message


class RealtimeCodec:
    name = "realtime"
    errors_end_session = True

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        self._listening_told = True  # a session starts listening: told only after each reply

    # ---- gateway -> client: admission --------------------------------------------------------

    def queued(self, status: QueueStatus) -> dict[str, Any]:
        return {"type": "session.queued", "position": status.position, "queue_length": status.queue_length,
                "estimated_wait_s": status.estimated_wait_s}

    def queue_done(self) -> dict[str, Any]:
        return {"type": "session.queue_done"}

    # ---- client -> gateway -------------------------------------------------------------------

    def parse(self, data: str) -> Command:
        message = parse_json(data)
        kind = message["type"]
        if kind == "session.init":
            return _init(object_field(message, "payload"))
        if kind == "input.append":
            return _append(object_field(message, "input"))
        if kind == "session.close":
            reason = message.get("reason")
            return Close(reason if isinstance(reason, str) and reason else "client")
        raise GatewayError(UNKNOWN_TYPE, f"unknown event type {kind!r}")

    # ---- duplex -> client --------------------------------------------------------------------

    def events(self, event: DuplexEvent) -> list[dict[str, Any]]:
        handler = getattr(self, "_on_" + event.type.replace(".", "_"), None)
        return handler(event) if handler is not None else []

    def error(self, code: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"code": code, "message": message}, "code": code, "message": message}

    def closed(self, reason: str) -> list[dict[str, Any]]:
        usage = self.context.usage.as_json()
        return [{"type": "usage", "usage": usage},
                {"type": "session.closed", "session_id": self.context.session_id, "reason": reason, "usage": usage}]

    def _on_session_created(self, event: DuplexEvent) -> list[dict[str, Any]]:
        return [{"type": "session.created", "session_id": self.context.session_id, "output_audio": OUTPUT_FORMAT,
                 "config_not_applied": list(self.context.not_applied)}]

    def _on_response_listen(self, event: DuplexEvent) -> list[dict[str, Any]]:
        if self._listening_told:
            return []
        self._listening_told = True
        return [{"type": "response.listen", "unit_index": event.fields.get("unit_index")}]

    def _on_response_text_delta(self, event: DuplexEvent) -> list[dict[str, Any]]:
        self._listening_told = False
        return [{"type": "response.output_text.delta", "response_id": event.fields.get("response_id"),
                 "text": event.fields.get("text", ""), "end_of_turn": False, **_latency(event, "ttft_ms")}]

    def _on_response_audio_delta(self, event: DuplexEvent) -> list[dict[str, Any]]:
        if event.audio is None:
            return []
        return [{"type": "response.output_audio.delta", "response_id": event.fields.get("response_id"),
                 "audio": pcm16_to_float32_base64(event.audio), **OUTPUT_FORMAT, **_latency(event, "ttfp_ms")}]

    def _on_response_done(self, event: DuplexEvent) -> list[dict[str, Any]]:
        self._listening_told = False
        fields, usage = event.fields, self.context.usage.as_json()
        response = {"id": fields.get("response_id"), "status": fields.get("status"), "usage": usage}
        if "reason" in fields:
            response["reason"] = fields["reason"]
        return [{"type": "response.output_text.delta", "response_id": fields.get("response_id"), "text": "",
                 "end_of_turn": True},
                {"type": "response.done", "response": response, "usage": usage}]

    def _on_error(self, event: DuplexEvent) -> list[dict[str, Any]]:
        return [self.error(str(event.fields.get("code", "error")), str(event.fields.get("message", "")))]


def _latency(event: DuplexEvent, name: str) -> dict[str, Any]:
    """The server's latency field of a reply's first text or audio (docs/metrics.md)."""
    return {name: event.fields[name]} if name in event.fields else {}


def _init(payload: dict[str, Any]) -> Init:
    params, not_applied = config_params(object_field(payload, "config"), CONFIG_TO_START)
    prompt = text_field(payload, "system_prompt")
    if prompt is not None:
        params["instructions"] = prompt
    params.update(start_params(object_field(payload, DUPLEX_PARAMS), f"{DUPLEX_PARAMS}."))
    voice = object_field(payload, "voice")
    ref_audio, voice_not_applied = voice_audio(voice.get("ref_audio_base64"), voice.get("tts_ref_audio_base64"))
    extra = ("max_slice_nums",) if payload.get("max_slice_nums") is not None else ()
    return Init(params, ref_audio, not_applied + voice_not_applied + extra)


def _append(body: dict[str, Any]) -> Append:
    if body.get("video_frames"):
        raise GatewayError(VIDEO_UNSUPPORTED, VIDEO_MESSAGE)
    try:
        pcm = float32_base64_to_pcm16(body.get("audio", ""))
    except AudioDecodeError as err:
        raise GatewayError(INVALID_AUDIO, str(err)) from None
    return Append(pcm, interrupt=bool(body.get("force_listen")))
