"""Tests for client/live.py and `minicpmo-client --mic`.

Strategy: a fake `sounddevice` module (devices at 48 kHz, as most are) whose input stream
delivers a 1 kHz tone from its own thread, as PortAudio does, and whose output stream records
what the speaker is asked to play; the session runs on the fake Triton client of conftest.py.
The real library is used where it says what is missing: this machine may have no PortAudio.
"""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from client import cli, live
from client.session import DuplexSession

DEVICE_RATE = 48000
CHUNK = (np.arange(4800) % 400 - 200).astype(np.int16)  # 200 ms at 24 kHz, audible


class PortAudioError(Exception):
    pass


def fake_sounddevice(*, devices: bool = True, blocks: int = 10) -> types.ModuleType:
    sd = types.ModuleType("sounddevice")
    sd.PortAudioError = PortAudioError
    sd.played = []  # what the output stream's callback produced, block by block

    def query_devices(kind: str) -> dict:
        if not devices:
            raise PortAudioError(f"Error querying device -1 ({kind})")
        return {"name": f"fake {kind}", "default_samplerate": float(DEVICE_RATE)}

    class InputStream:
        def __init__(self, samplerate, channels, dtype, blocksize, callback):
            assert (samplerate, channels, dtype) == (DEVICE_RATE, 1, "int16")
            self._blocksize, self._callback, self._thread = blocksize, callback, None

        def _run(self) -> None:
            t = np.arange(blocks * self._blocksize) / DEVICE_RATE
            tone = np.rint(8000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
            for i in range(blocks):
                self._callback(tone[i * self._blocksize:(i + 1) * self._blocksize, None], self._blocksize, None, None)

        def start(self) -> None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

        def stop(self) -> None:
            self._thread.join(10)

        def close(self) -> None:
            pass

    class OutputStream:
        def __init__(self, samplerate, channels, dtype, callback):
            assert (samplerate, channels, dtype) == (DEVICE_RATE, 1, "int16")
            self._callback = callback

        def start(self) -> None:
            pass

        def stop(self) -> None:  # PortAudio drains the queue before it stops: play it all now
            for _ in range(20):
                out = np.full((4800, 1), 12345, np.int16)  # stale data the callback must overwrite
                self._callback(out, 4800, None, None)
                sd.played.append(out[:, 0].copy())

        def close(self) -> None:
            pass

    sd.query_devices, sd.InputStream, sd.OutputStream = query_devices, InputStream, OutputStream
    return sd


def reply_on_first_append(fake, request):
    appends = [r for r in fake.uplink_requests() if fake.action_of(r) == "append"]
    if len(appends) != 1 or fake.action_of(request) != "append":
        return
    fake.emit({"type": "response.created", "response_id": "r1"})
    fake.emit({"type": "response.audio.delta", "response_id": "r1", "turn_id": 0, "text": "hi",
               "audio_ms": 200, "ttfp_ms": 90}, CHUNK)
    fake.emit({"type": "response.done", "response_id": "r1", "status": "completed"})
    fake.flush()


@pytest.fixture
def connect_to(monkeypatch):
    def patch(fake):
        def connect(url, session_id=None, *, model_name="duplex"):
            return DuplexSession(fake, session_id or "live-test", model_name=model_name)

        monkeypatch.setattr(DuplexSession, "connect", staticmethod(connect))

    return patch


def test_live_session_streams_16k_and_plays_the_reply(tmp_path, capsys, monkeypatch, fake_client_factory,
                                                      connect_to):
    sd = fake_sounddevice(blocks=10)  # 2 s captured at 48 kHz
    monkeypatch.setattr(live, "load_sounddevice", lambda: sd)
    fake = fake_client_factory(on_request=reply_on_first_append)
    connect_to(fake)
    code = cli.main(["--mic", "--max-seconds", "1", "--output", str(tmp_path / "r.wav"), "--quiet"])
    assert code == 0, capsys.readouterr()
    assert "live from the microphone" in capsys.readouterr().out
    appends = [fake.audio_of(r) for r in fake.uplink_requests() if fake.action_of(r) == "append"]
    assert sum(a.shape[0] for a in appends) == 16000, "--max-seconds 1 of the capture, at 16 kHz"
    played = np.concatenate(sd.played)
    assert np.count_nonzero(played) > 0.99 * CHUNK.shape[0] * 2, "the whole 24 kHz reply, at 48 kHz"
    assert not (played == 12345).any(), "the speaker plays silence, not stale buffers, after the reply"


def test_microphone_blocks_are_resampled_and_stop_on_request():
    sd = fake_sounddevice(blocks=5)
    mic = live.Microphone(sd, DEVICE_RATE, 200)
    stopped = threading.Event()
    with mic:
        blocks = []
        for block in mic.blocks(10.0, stopped.is_set):
            blocks.append(block)
            if len(blocks) == 3:
                stopped.set()
    assert len(blocks) == 3 and all(b.dtype == np.int16 for b in blocks)
    assert abs(sum(b.shape[0] for b in blocks) - 3 * 3200) <= 400  # less the filter's delay (about 20 ms)


def test_no_device_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(live, "load_sounddevice", lambda: fake_sounddevice(devices=False))
    monkeypatch.setattr(DuplexSession, "connect", None)  # reaching the server would fail loudly
    assert cli.main(["--mic"]) == 2
    err = capsys.readouterr().err
    assert "no usable default audio input and output device" in err and "--input" in err


def test_missing_portaudio_is_a_clear_error(monkeypatch, capsys):
    """The real import where PortAudio is absent; a stand-in failing import where it is present."""
    try:
        import sounddevice  # noqa: F401
    except OSError:
        pass
    else:
        def no_portaudio():
            try:
                raise OSError("PortAudio library not found")
            except OSError as exc:
                raise live.NoAudioDevice(f"live mode needs the PortAudio library ({exc}); "
                                         f"{live.INSTALL_HINT}") from exc

        monkeypatch.setattr(live, "load_sounddevice", no_portaudio)
    monkeypatch.setattr(DuplexSession, "connect", None)
    assert cli.main(["--mic"]) == 2
    err = capsys.readouterr().err
    assert "live mode needs the PortAudio library" in err and "libportaudio2" in err


def test_a_device_that_will_not_start_is_a_clear_error(monkeypatch, capsys, fake_client_factory, connect_to):
    sd = fake_sounddevice()

    def refuse(self) -> None:
        raise PortAudioError("Device unavailable [PaErrorCode -9985]")

    sd.InputStream.start = refuse
    monkeypatch.setattr(live, "load_sounddevice", lambda: sd)
    connect_to(fake_client_factory())
    assert cli.main(["--mic", "--quiet"]) == 2
    assert "the microphone did not start (Device unavailable" in capsys.readouterr().err
