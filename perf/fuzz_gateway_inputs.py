"""Hypothesis strategies that draw bad (and some valid) traffic for the WebSocket gateway's two
front doors (docs/gateway.md): a `GatewayCase` is one connection, its handshake and its frames.

Each `Frame` says what it means (`effect`) beside its bytes, so that perf/fuzz_gateway_oracle.py
decides what it should get from the protocol's documentation, and a failing case prints compactly.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from perf.fuzz_oracle import START_RULES

REALTIME, DEMO = "realtime", "demo"
# Config fields each protocol maps to START parameters (backends/gateway/*_codec.py, docs/gateway.md).
# config name -> START parameter
MAPPED = {REALTIME: {**{name: name for name in ("temperature", "length_penalty", "max_kv_tokens", "tts_enabled")},
                     "max_tokens": "max_reply_tokens"},
          DEMO: {**{name: name for name in ("temperature", "force_listen_count", "top_k", "top_p",
                                            "max_new_speak_tokens_per_chunk", "listen_prob_scale")},
                 "generate_audio": "tts_enabled"}}
NOT_MAPPED = {REALTIME: ("vision_hd",), DEMO: ("chunk_ms",)}
FLAGS = ("tts_enabled",)  # START parameters a config gives as a boolean
RATE_SLACK_S = 4
INT64_MAX = 2**63 - 1  # a START parameter is at most an int64 (and -2**63 is never drawn)


@dataclass(frozen=True)
class Frame:
    """One client frame. effect: init (params, voice), append, close, bad (code), noop (demo
    pause/resume/diagnostic), binary (JSON sent as a binary frame: read as its text)."""

    effect: str
    data: str
    code: str = ""  # bad: the documented error code
    params: tuple[tuple[str, object], ...] = ()  # init: the START parameters it asks for
    voice: str = "none"  # init: none | ok | short | bad
    seconds: float = 0.0  # append: audio length

    def __repr__(self) -> str:
        detail = self.code or ",".join(f"{k}={v!r}"[:60] for k, v in self.params) or f"{self.seconds:g}s"
        return f"{self.effect}({detail}|{len(self.data)}B {self.data[:100]!r})"


@dataclass(frozen=True)
class Handshake:
    key: str = "bearer"  # bearer | subprotocol | missing | wrong
    origin: str = "none"  # none | own | foreign
    subprotocol: str = "right"  # right | wrong | none
    path_id: str = "fz"  # demo: the path's session id
    mode: str = "audio"  # realtime: the `mode` query parameter ("omitted": none)


@dataclass(frozen=True)
class GatewayCase:
    category: str
    protocol: str
    handshake: Handshake
    frames: tuple[Frame, ...]
    disconnect: bool = False  # drop the TCP connection after the frames instead of closing

    def __repr__(self) -> str:
        return f"{self.protocol} {self.handshake} {list(self.frames)} disconnect={self.disconnect}"


def b64_float32(samples: np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, "<f4").tobytes()).decode()


def _silence(seconds: float) -> str:
    return b64_float32(np.zeros(int(16000 * seconds), np.float32))


def _msg(protocol: str, kind: str, **fields) -> str:
    return json.dumps({"type": kind, **fields})


def append(protocol: str, audio: object, seconds: float = 0.0, effect: str = "append", code: str = "") -> Frame:
    body = {"type": "input.append", "input": {"audio": audio}} if protocol == REALTIME else \
        {"type": "audio_chunk", "audio_base64": audio}
    return Frame(effect, json.dumps(body), code=code, seconds=seconds)


def close(protocol: str) -> Frame:
    return Frame("close", _msg(protocol, "session.close" if protocol == REALTIME else "stop", reason="fuzz"))


VOICE_SAMPLES = {"ok": 16000, "short": 100}


def init(protocol: str, params: dict[str, object], prompt: object = None, voice: str = "none",
         config: dict[str, object] | None = None) -> Frame:
    """A session.init / prepare; `params` go to duplex_params (Realtime) and are listed as asked."""
    voice_b64 = {"none": None, "bad": "@@not-base64"}.get(voice) if voice not in VOICE_SAMPLES else b64_float32(
        np.full(VOICE_SAMPLES[voice], 0.1, np.float32))
    if protocol == REALTIME:
        payload: dict[str, object] = {"config": config or {}, "duplex_params": params}
        if prompt is not None:
            payload["system_prompt"] = prompt
        if voice_b64:
            payload["voice"] = {"ref_audio_base64": voice_b64}
        data = json.dumps({"type": "session.init", "payload": payload})
    else:
        body: dict[str, object] = {"type": "prepare", "config": config or {}}
        if prompt is not None:
            body["prefix_system_prompt"] = prompt
        if voice_b64:
            body["ref_audio_base64"] = voice_b64
        data = json.dumps(body)
    asked, code = dict(params), ""
    for name, value in (config or {}).items():
        if name in MAPPED[protocol] and value is not None:
            start = MAPPED[protocol][name]
            asked[start] = value
            if start in FLAGS:
                code = code if isinstance(value, bool) else "invalid_event"  # the gateway's own check
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int) and abs(value) > INT64_MAX):
                code = "invalid_event"  # the gateway's own check: a number a request parameter holds
    if isinstance(prompt, str) and prompt:
        asked["instructions"] = prompt
    return Frame("init", data, code=code, params=tuple(asked.items()), voice=voice)


# ---- values ---------------------------------------------------------------------------------

def _odd_values() -> st.SearchStrategy[object]:
    return st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, width=32, allow_subnormal=False),
                     st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                               st.integers(), max_size=1))


def _config_value(name: str) -> st.SearchStrategy[object]:
    if name in ("temperature", "top_p", "listen_prob_scale", "length_penalty"):
        return st.one_of(st.floats(-5, 20, width=32, allow_subnormal=False), st.sampled_from([0.0, 1.0, 2.0, 2.5, -0.1]), _odd_values())
    if name in ("tts_enabled", "generate_audio"):
        return st.one_of(st.booleans(), _odd_values())
    if name == "max_kv_tokens":
        return st.one_of(st.sampled_from([511, 512, 4096, 1 << 20, (1 << 20) + 1]), _odd_values())
    return st.one_of(st.integers(-5, 2000), _odd_values())


# ---- cases ----------------------------------------------------------------------------------

@st.composite
def _protocol_and_init(draw) -> tuple[str, Frame]:
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    return protocol, init(protocol, {})


@st.composite
def malformed(draw) -> GatewayCase:
    protocol, ok = draw(_protocol_and_init())
    frame = draw(st.sampled_from([
        Frame("bad", "{not json", code="invalid_json"),
        Frame("bad", "", code="invalid_json"),
        Frame("bad", "[1, 2]", code="invalid_event"),
        Frame("bad", json.dumps({"type": 7}), code="invalid_event"),
        Frame("bad", json.dumps({"no_type": 1}), code="invalid_event"),
        Frame("bad", json.dumps("a string"), code="invalid_event"),
        Frame("bad", json.dumps({"type": "nonsense.event"}), code="unknown_event_type"),
        Frame("bad", json.dumps({"type": ""}), code="unknown_event_type"),
    ]))
    first = draw(st.booleans())
    frames = (frame, ok, close(protocol)) if first else (ok, frame, close(protocol))
    return GatewayCase("malformed", protocol, Handshake(), frames)


@st.composite
def wrong_types(draw) -> GatewayCase:
    """A wrong type in a field the codecs read: the init's objects and strings, the audio."""
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    where = draw(st.sampled_from(("payload", "config", "voice", "prompt", "audio", "duplex_params")))
    texts = st.nothing() if where == "prompt" else st.text(min_size=1, max_size=4)
    value = draw(st.one_of(st.integers().filter(bool), st.lists(st.integers(), min_size=1, max_size=2), st.just(True), texts))
    if where == "audio":
        return GatewayCase("wrong_types", protocol, Handshake(),
                           (init(protocol, {}), append(protocol, value, effect="bad", code="invalid_audio"),
                            close(protocol)))
    if protocol == REALTIME:
        payload = {"payload": value} if where == "payload" else {"payload": {
            {"config": "config", "voice": "voice", "prompt": "system_prompt", "duplex_params": DUPLEX}[where]: value}}
        message = {"type": "session.init", **payload}
    else:
        name = {"payload": "config", "config": "config", "voice": "ref_audio_base64",
                "prompt": "prefix_system_prompt", "duplex_params": "config"}[where]
        message = {"type": "prepare", name: value}
    code = "invalid_audio" if protocol == DEMO and where == "voice" else "invalid_event"
    return GatewayCase("wrong_types", protocol, Handshake(), (Frame("bad", json.dumps(message), code=code),
                                                                close(protocol)))


DUPLEX = "duplex_params"


@st.composite
def bad_config(draw) -> GatewayCase:
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    names = (*MAPPED[protocol], *NOT_MAPPED[protocol])
    config = draw(st.dictionaries(st.sampled_from(names), st.deferred(lambda: st.just(None)), min_size=1, max_size=3))
    config = {name: draw(_config_value(name)) for name in config}
    frames = [init(protocol, {}, config=config)]
    if draw(st.booleans()):
        frames.append(append(protocol, _silence(0.1), 0.1))
    return GatewayCase("bad_config", protocol, Handshake(), (*frames, close(protocol)))


@st.composite
def duplex_params(draw) -> GatewayCase:
    """Realtime's pass-through START parameters: the server's validation answers through the gateway."""
    keys = draw(st.lists(st.sampled_from(sorted(START_RULES) + ["bogus_key"]), min_size=1, max_size=3, unique=True))
    params = {key: draw(st.one_of(st.integers(-3, 5000), st.floats(-1, 3, width=32, allow_subnormal=False), st.sampled_from(["off", "context", "", "of\x00f"]),
                                  st.booleans())) for key in keys}
    return GatewayCase("duplex_params", REALTIME, Handshake(), (init(REALTIME, params), close(REALTIME)))


@st.composite
def prompts(draw) -> GatewayCase:
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    size = draw(st.sampled_from((0, 10, 3999, 4001, 5000, 60000)))
    char = draw(st.sampled_from(("a", "é", "語", "\x00")))
    return GatewayCase("prompt", protocol, Handshake(), (init(protocol, {}, prompt=char * size), close(protocol)))


@st.composite
def voices(draw) -> GatewayCase:
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    voice = draw(st.sampled_from(("ok", "short", "bad")))
    prompt = draw(st.one_of(st.none(), st.text(max_size=20).filter(lambda text: "\x00" not in text)))
    return GatewayCase("voice", protocol, Handshake(), (init(protocol, {}, prompt=prompt, voice=voice), close(protocol)))


@st.composite
def audio(draw) -> GatewayCase:
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    kind = draw(st.sampled_from(("invalid", "odd", "nan", "inf", "empty", "loud", "oversize", "past_close_limit")))
    if kind == "invalid":
        frame = append(protocol, draw(st.sampled_from(["@@@", "AAA", "A===", "ü"])), effect="bad", code="invalid_audio")
    elif kind == "odd":
        raw = bytes(draw(st.integers(1, 40)) * 4 + draw(st.integers(1, 3)))
        frame = append(protocol, base64.b64encode(raw).decode(), effect="bad", code="invalid_audio")
    elif kind in ("nan", "inf"):
        samples = np.zeros(1600, np.float32)
        samples[draw(st.integers(0, 1599))] = np.nan if kind == "nan" else -np.inf
        frame = append(protocol, b64_float32(samples), effect="bad", code="invalid_audio")
    elif kind == "empty":
        frame = append(protocol, "", 0.0)
    elif kind == "loud":
        frame = append(protocol, b64_float32(np.full(1600, 7.5, np.float32)), 0.1)
    elif kind == "oversize":
        frame = append(protocol, "A" * draw(st.sampled_from((300_000, 600_000))), effect="bad", code="message_too_large")
    else:  # past 4 times the message limit: the gateway closes the connection (1009)
        frame = append(protocol, "A" * 1_100_000, effect="dropped")
    return GatewayCase("audio", protocol, Handshake(), (init(protocol, {}), frame, close(protocol)))


@st.composite
def rate(draw) -> GatewayCase:
    """Whole seconds of audio at once: within the slack, or far past it (never at the edge)."""
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    seconds = draw(st.sampled_from((1, 2, 3, 6, 8, 10)))
    chunk = draw(st.sampled_from((0.5, 1.0, 2.0)))
    frames = [append(protocol, _silence(chunk), chunk) for _ in range(int(seconds / chunk))]
    return GatewayCase("rate", protocol, Handshake(), (init(protocol, {}), *frames, close(protocol)))


@st.composite
def order(draw) -> GatewayCase:
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    seconds = draw(st.sampled_from((0.0, 0.02, 0.1, 0.3)))
    ok, silence = init(protocol, {}), append(protocol, _silence(seconds), seconds)
    shape = draw(st.sampled_from(("append_first", "init_twice", "close_twice", "after_close", "close_first",
                                  "noop_first" if protocol == DEMO else "init_twice")))
    frames = {
        "append_first": (silence, ok, close(protocol)),
        "init_twice": (ok, ok, close(protocol)),
        "close_twice": (ok, close(protocol), close(protocol)),
        "after_close": (ok, close(protocol), silence, ok),
        "close_first": (close(protocol), ok),
        "noop_first": (Frame("noop", _msg(DEMO, draw(st.sampled_from(("pause", "resume"))))), ok, close(protocol)),
    }[shape]
    return GatewayCase("order", protocol, Handshake(), frames)


@st.composite
def handshakes(draw) -> GatewayCase:
    protocol = draw(st.sampled_from((REALTIME, DEMO)))
    shake = Handshake(key=draw(st.sampled_from(("bearer", "subprotocol", "missing", "wrong"))),
                      origin=draw(st.sampled_from(("none", "own", "foreign"))),
                      subprotocol=draw(st.sampled_from(("right", "wrong", "none"))),
                      path_id=draw(st.sampled_from(("fz", "x" * 200, "%E8%AA%9E", "a.b-c_d~", "..%2F.."))),
                      mode=draw(st.sampled_from(("audio", "omitted", "video", ""))))
    if shake.key == "subprotocol" and shake.subprotocol == "none":
        shake = Handshake("subprotocol", shake.origin, "right", shake.path_id, shake.mode)
    return GatewayCase("handshake", protocol, shake, (init(protocol, {}), close(protocol)))


@st.composite
def binary(draw) -> GatewayCase:
    protocol, ok = draw(_protocol_and_init())
    payload = draw(st.one_of(st.just(ok.data.encode()), st.binary(min_size=1, max_size=64).map(lambda b: b"\xff" + b)))
    frame = Frame("binary", payload.decode("latin-1"),
                  code="" if payload == ok.data.encode() else "invalid_json")
    return GatewayCase("binary", protocol, Handshake(), (frame, close(protocol)))


@st.composite
def disconnects(draw) -> GatewayCase:
    protocol, ok = draw(_protocol_and_init())
    lengths = draw(st.lists(st.sampled_from((0.02, 0.1, 0.5)), max_size=4))
    frames = (ok, *(append(protocol, _silence(seconds), seconds) for seconds in lengths))
    return GatewayCase("disconnect", protocol, Handshake(), frames[:draw(st.integers(0, len(frames)))], disconnect=True)


def gateway_cases() -> st.SearchStrategy[GatewayCase]:
    return st.one_of(malformed(), wrong_types(), bad_config(), duplex_params(), prompts(), voices(), audio(), rate(),
                     order(), handshakes(), binary(), disconnects())
