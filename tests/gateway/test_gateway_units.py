"""The gateway's small parts without a server: API keys, the input rate bound, audio
conversion, capacity from a model config, usage, and message codecs."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from backends.gateway.audio import AudioDecodeError, float32_base64_to_pcm16, pcm16_to_float32_base64
from backends.gateway.auth import ENV_KEYS, ApiKeys, key_line, presented_key
from backends.gateway.capacity import capacity_of
from backends.gateway.commands import Append, Close, Init
from backends.gateway.config import config_of, parse_args
from backends.gateway.demo_codec import DemoCodec
from backends.gateway.errors import GatewayError
from backends.gateway.rate import InputRate
from backends.gateway.realtime_codec import RealtimeCodec
from backends.gateway.session_context import SessionContext
from backends.gateway.usage import Usage


def test_keys_from_file_and_environment(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# comment\n\n{key_line('alpha')}\n")
    keys = ApiKeys.load(path, {ENV_KEYS: "beta, gamma"})
    assert keys.required and all(keys.accepts(key) for key in ("alpha", "beta", "gamma"))
    assert not keys.accepts("delta") and not keys.accepts(None) and not keys.accepts("")
    assert ApiKeys.load(None, {}).accepts(None)  # no keys: open
    path.write_text("alpha\n")  # a plain key is not a digest line
    with pytest.raises(ValueError):
        ApiKeys.load(path, {})


def test_key_from_bearer_or_subprotocol():
    assert presented_key({"Authorization": "Bearer k1"}, []) == "k1"
    assert presented_key({}, ["map.realtime", "apikey.k2"]) == "k2"
    assert presented_key({}, ["map.realtime"]) is None


def test_input_rate_is_real_time_plus_slack():
    now = [0.0]
    rate = InputRate(slack_s=2.0, clock=lambda: now[0])
    assert rate.admit(32000) and not rate.admit(1)  # 2 s at once: the slack
    now[0] = 1.0
    assert rate.admit(16000) and not rate.admit(1)
    rate.restart()
    assert rate.admit(32000)


def test_audio_round_trip_and_bad_audio():
    pcm = np.array([0, 16384, -32768, 32767], np.int16)
    back = float32_base64_to_pcm16(pcm16_to_float32_base64(pcm))
    assert np.abs(back.astype(int) - pcm).max() <= 1
    for bad in ("@@", base64.b64encode(b"abc").decode(), base64.b64encode(np.float32([np.nan]).tobytes()).decode(), 5):
        with pytest.raises(AudioDecodeError):
            float32_base64_to_pcm16(bad)


def test_capacity_is_per_instance_sessions_times_instances():
    config = {"parameters": {"max_sessions": {"string_value": "16"}}, "instance_group": [{"count": 2}]}
    assert capacity_of(config) == 32


def test_usage_counts_whole_units_and_codec_frames():
    usage = Usage()
    usage.add_input(16000 * 3 + 100)
    usage.add_output_audio(24000 * 2)
    usage.add_text({"n_tokens": 7})
    body = usage.as_json()
    assert body["input_tokens"] == 30 and body["output_tokens_details"] == {"audio_tokens": 50, "text_tokens": 7}
    assert body["total_tokens"] == 30 + 57


def test_realtime_init_maps_fields_and_lists_the_unapplied():
    codec = RealtimeCodec(SessionContext("s"))
    voice = pcm16_to_float32_base64(np.zeros(1600, np.int16))
    init = codec.parse(json.dumps({"type": "session.init", "payload": {
        "system_prompt": "Be brief.", "config": {"temperature": 0.5, "length_penalty": 1.3, "max_tokens": 100,
                                                          "tts_enabled": True, "max_kv_tokens": 4096, "vision_hd": True},
        "voice": {"ref_audio_base64": voice}}}))
    assert isinstance(init, Init) and init.params == {"temperature": 0.5, "length_penalty": 1.3, "tts_enabled": True,
                                                      "max_kv_tokens": 4096, "max_reply_tokens": 100,
                                                      "instructions": "Be brief."}
    assert init.ref_audio.size == 1600 and init.not_applied == ("vision_hd",)
    append = codec.parse(json.dumps({"type": "input.append", "input": {"audio": voice, "force_listen": True}}))
    assert isinstance(append, Append) and append.interrupt
    assert codec.parse(json.dumps({"type": "session.close", "reason": "bye"})) == Close("bye")
    for config in ({"temperature": "hot"}, {"tts_enabled": 1}, {"max_kv_tokens": True}):
        with pytest.raises(GatewayError) as err:
            codec.parse(json.dumps({"type": "session.init", "payload": {"config": config}}))
        assert err.value.code == "invalid_event"


def test_demo_prepare_and_messages():
    codec = DemoCodec(SessionContext("s"), client_id="adx_1")
    init = codec.parse(json.dumps({"type": "prepare", "prefix_system_prompt": "Hi.", "ref_audio_path": "a.wav",
                                   "config": {"temperature": 0.7, "force_listen_count": 3, "top_k": 20,
                                              "generate_audio": False}}))
    assert init.params == {"temperature": 0.7, "force_listen_count": 3, "top_k": 20, "tts_enabled": False,
                           "instructions": "Hi."}
    assert init.not_applied == ("ref_audio_path",)
    with pytest.raises(GatewayError) as err:
        codec.parse(json.dumps({"type": "video_frame", "frame": "AAAA"}))
    assert err.value.code == "video_not_supported"
    assert codec.closed("client")[0] == {"type": "stopped", "session_id": "adx_1", "reason": "client",
                                         "usage": Usage().as_json()}


def test_command_line():
    config = config_of(parse_args(["--triton", "h:1", "--session-default", "reply_units=2",
                                   "--session-default", "voice=default", "--allowed-origin", "https://a.example"]))
    assert config.session_defaults == {"reply_units": 2, "voice": "default"}
    assert config.allowed_origins == ("https://a.example",)
    with pytest.raises(ValueError):
        config_of(parse_args(["--certfile", "c.pem"]))
