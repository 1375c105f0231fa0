"""Live mode: the default microphone streams to a duplex session in real time while the reply
plays on the default speaker as it arrives (sounddevice, over PortAudio).

Devices run at their own rates; soxr's streaming resampler (anti-aliased, as for files) turns
the capture into 16 kHz and the 24 kHz reply into the speaker's rate. Where PortAudio is not
installed or there is no input or output device, `open_audio` raises NoAudioDevice with a
message saying what is missing, before any session starts.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import soxr

from client.events import AudioDelta, DuplexEvent, ResponseDone
from client.metrics import OUTPUT_SAMPLE_RATE, SessionReport
from client.params import SessionParams
from client.recorder import TurnRecorder
from client.errors import DuplexProtocolError, DuplexStreamError, DuplexTimeout
from client.session import INPUT_SAMPLE_RATE, DuplexSession
from client.streaming import EventHook, SessionRun, StreamConfig

QUALITY = "HQ"  # soxr, as client/resample.py
BLOCK_WAIT_S = 0.05  # how often the capture loop looks at the stop flag while no block comes
INSTALL_HINT = "install PortAudio (Debian/Ubuntu: apt-get install libportaudio2) or stream a file with --input"


class NoAudioDevice(RuntimeError):
    """Live mode cannot run here; the message says what is missing."""


def load_sounddevice() -> ModuleType:
    """sounddevice, whose import loads PortAudio; NoAudioDevice where the library is missing."""
    try:
        import sounddevice
    except ImportError as exc:
        raise NoAudioDevice(f"live mode needs the sounddevice package ({exc})") from exc
    except OSError as exc:  # sounddevice raises OSError when it cannot load PortAudio
        raise NoAudioDevice(f"live mode needs the PortAudio library ({exc}); {INSTALL_HINT}") from exc
    return sounddevice


class _Resampler:
    """int16 blocks from one rate to another, streaming (the filter state spans blocks)."""

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        self._rates = (src_rate, dst_rate)
        self._stream = self._new_stream()

    def _new_stream(self) -> "soxr.ResampleStream | None":
        src, dst = self._rates
        return None if src == dst else soxr.ResampleStream(src, dst, 1, dtype="int16", quality=QUALITY)

    def __call__(self, block: np.ndarray) -> np.ndarray:
        return block if self._stream is None else self._stream.resample_chunk(block)

    def flush(self) -> np.ndarray:
        """What the filter still holds (its delay, ~20 ms); the next block starts afresh."""
        if self._stream is None:
            return np.zeros(0, np.int16)
        tail = self._stream.resample_chunk(np.zeros(0, np.int16), last=True)
        self._stream = self._new_stream()
        return tail


class Microphone:
    """The default input device; `blocks` yields 16 kHz int16 mono, `append_ms` at a time."""

    def __init__(self, sd: ModuleType, device_rate: int, append_ms: int) -> None:
        self._sd = sd
        self._captured: queue.Queue[np.ndarray] = queue.Queue()
        self._to_uplink = _Resampler(device_rate, INPUT_SAMPLE_RATE)
        self._stream = sd.InputStream(samplerate=device_rate, channels=1, dtype="int16",
                                      blocksize=device_rate * append_ms // 1000, callback=self._on_audio)

    def _on_audio(self, indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        self._captured.put(indata[:, 0].copy())  # [frames] int16, on PortAudio's thread

    def blocks(self, max_seconds: float, should_stop: Callable[[], bool]) -> Iterator[np.ndarray]:
        """Captured audio until `should_stop()` or `max_seconds` of it."""
        left = int(max_seconds * INPUT_SAMPLE_RATE)
        while left > 0 and not should_stop():
            try:
                block = self._to_uplink(self._captured.get(timeout=BLOCK_WAIT_S))[:left]
            except queue.Empty:
                continue
            left -= block.shape[0]
            yield block

    def __enter__(self) -> "Microphone":
        _start(self._sd, self._stream, "microphone")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.stop()
        self._stream.close()


class Speaker:
    """The default output device, playing 24 kHz int16 as `play` queues it; silence between."""

    def __init__(self, sd: ModuleType, device_rate: int) -> None:
        self._sd = sd
        self._lock = threading.Lock()
        self._pending: collections.deque[np.ndarray] = collections.deque()  # at the device rate
        self._from_reply = _Resampler(OUTPUT_SAMPLE_RATE, device_rate)
        self._stream = sd.OutputStream(samplerate=device_rate, channels=1, dtype="int16", callback=self._fill)

    def play(self, pcm16: np.ndarray) -> None:
        self._queue(self._from_reply(pcm16))

    def end_of_reply(self) -> None:
        """Play what the resampler still holds of the reply: nothing follows it soon."""
        self._queue(self._from_reply.flush())

    def _queue(self, block: np.ndarray) -> None:
        with self._lock:
            self._pending.append(block)

    def _fill(self, outdata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        """PortAudio asks for `frames` samples: the queued reply, zeros past its end."""
        out = outdata[:, 0]
        filled = 0
        with self._lock:
            while filled < frames and self._pending:
                head = self._pending[0]
                take = min(frames - filled, head.shape[0])
                out[filled: filled + take] = head[:take]
                filled += take
                if take == head.shape[0]:
                    self._pending.popleft()
                else:
                    self._pending[0] = head[take:]
        out[filled:] = 0

    def __enter__(self) -> "Speaker":
        _start(self._sd, self._stream, "speaker")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.stop()
        self._stream.close()


def _start(sd: ModuleType, stream: Any, what: str) -> None:
    """Start a PortAudio stream; NoAudioDevice when the device refuses (busy, unplugged)."""
    try:
        stream.start()
    except sd.PortAudioError as exc:
        raise NoAudioDevice(f"the {what} did not start ({exc})") from exc


def open_audio(append_ms: int, sd: ModuleType | None = None) -> tuple[Microphone, Speaker]:
    """The default microphone and speaker at their own rates; NoAudioDevice says what is missing."""
    sd = sd if sd is not None else load_sounddevice()
    try:
        mic_info, speaker_info = sd.query_devices(kind="input"), sd.query_devices(kind="output")
        mic = Microphone(sd, int(mic_info["default_samplerate"]), append_ms)
        speaker = Speaker(sd, int(speaker_info["default_samplerate"]))
    except (sd.PortAudioError, ValueError) as exc:  # no default device, or it cannot be opened
        raise NoAudioDevice(f"no usable default audio input and output device ({exc}); "
                            f"check `python -m sounddevice`, or stream a file with --input") from exc
    return mic, speaker


def stream_live(session: DuplexSession, mic: Microphone, speaker: Speaker, params: SessionParams | None,
                config: StreamConfig, *, should_stop: Callable[[], bool],
                on_event: EventHook | None = None) -> SessionReport:
    """One session from the microphone until `should_stop()` or `config.max_seconds`, the reply
    played as it arrives. The caller closes `session` and the devices."""

    def hear(event: DuplexEvent) -> None:
        if isinstance(event, AudioDelta):
            speaker.play(event.audio)
        elif isinstance(event, ResponseDone):
            speaker.end_of_reply()
        if on_event is not None:
            on_event(event)

    started_s = session.start(params, None)
    run = SessionRun(session, TurnRecorder(started_s), hear)
    input_ms = 0.0
    try:
        if run.wait_created(config.created_timeout_s):
            input_ms = run.stream_blocks(mic.blocks(config.max_seconds, should_stop))
        run.finish(config.close_timeout_s)
    except (DuplexTimeout, DuplexStreamError, DuplexProtocolError) as exc:
        run.errors.append(f"{type(exc).__name__}: {exc}")
    return run.report(input_ms, 0.0, started_s)
