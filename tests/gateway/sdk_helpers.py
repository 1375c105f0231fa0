"""Driving the gateway's /v1/realtime with the real openbmb-realtime SDK: audio of the
repository's utterance plus silence, paced a little ahead of real time (within the gateway's
input bound), and the events collected until the session closes."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
from openbmb_realtime import AudioDelta, RealtimeClient, RealtimeConfig, TextDelta

from backends.serving.server_process import PROJECT_ROOT
from client.wav import read_wav

RATE = 16000
CHUNK_S = 0.25
AHEAD_S = 2.0  # how far ahead of real time the helpers send (the gateway allows 4 s)


def utterance() -> np.ndarray:
    """The repository's 16 kHz utterance as float32 samples."""
    samples = read_wav(PROJECT_ROOT / "client" / "data" / "hello_16k.wav").samples
    return samples.reshape(samples.shape[0], -1)[:, 0].astype(np.float32) / 32768.0


def speech_then_silence(silence_s: float) -> np.ndarray:
    return np.concatenate([utterance(), np.zeros(int(silence_s * RATE), np.float32)])


def client(url: str, key: str, **kwargs) -> RealtimeClient:
    return RealtimeClient(api_key=key, base_url=url, connect_timeout=60.0, close_timeout=30.0, **kwargs)


async def connect(url: str, key: str, **kwargs):
    return await client(url, key).audio.connect(model="minicpm-o-4.5", config=RealtimeConfig(temperature=0.7), **kwargs)


async def send_paced(session, audio: np.ndarray, stop: asyncio.Event | None = None) -> None:
    """Chunks of CHUNK_S, at most AHEAD_S ahead of real time."""
    step, start = int(CHUNK_S * RATE), time.monotonic()
    for offset in range(0, audio.size, step):
        if stop is not None and stop.is_set():
            return
        ahead = offset / RATE - (time.monotonic() - start)
        if ahead > AHEAD_S:
            await asyncio.sleep(ahead - AHEAD_S)
        await session.send_audio(audio[offset:offset + step].tobytes())


@dataclass
class Collected:
    events: list = field(default_factory=list)
    first_audio_s: float | None = None

    def of(self, kind: type) -> list:
        return [event for event in self.events if isinstance(event, kind)]


def end_of_turn(event) -> bool:
    return isinstance(event, TextDelta) and event.end_of_turn


async def collect(session, until=end_of_turn, started: float | None = None) -> Collected:
    """Events until one for which `until` is true (or the session's end)."""
    got, started = Collected(), started or time.monotonic()
    async for event in session:
        got.events.append(event)
        if isinstance(event, AudioDelta) and got.first_audio_s is None:
            got.first_audio_s = time.monotonic() - started
        if until(event):
            break
    return got
