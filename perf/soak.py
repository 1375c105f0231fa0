"""Soak test (not in CI): N concurrent real-time sessions for M minutes with random barge-ins.

    python -m perf.soak --sessions 4 --minutes 2                  # starts its own cpu server
    python -m perf.soak --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002 --server-pid 1234

Each worker keeps one session open at a time: it streams 200 ms appends in real time (a
second of speech-like noise opens each user turn, silence follows), lets the model reply
(the reply-shape knobs force `--reply-units` speaking units), barges in (`cancel`) on a reply
with probability `--barge-in`, and starts a new session after `--turns` turns. Every
`--report-every` seconds it prints one line: sessions, turns, barge-ins, errors, the median
server TTFP of the window, the server's memory (RSS of its process tree) and what the stages
hold (resource gauges). At the end: errors by kind, TTFP drift (first vs last window, slope),
memory growth, and what the server still holds once the last session ended (sessions, session
threads, stage requests, KV blocks, codec states against their values at the start). Exit
status 1 when any error was seen or anything is still held.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.serving.resource_gauges import parse_gauges
from client.errors import DuplexProtocolError, DuplexStreamError, DuplexTimeout
from client.events import AudioDelta, ErrorEvent, RequestFailed, ResponseDone, SessionCreated
from client.params import SessionParams
from client.session import DuplexSession

APPEND_S = 0.2
APPEND_SAMPLES = 3200  # 200 ms at 16 kHz
SPEECH_APPENDS = 5  # one second of speech opens a user turn
TURN_TIMEOUT_S = 30.0
GAUGES = (("sessions", "duplex"), ("session_threads", "duplex"), ("stage_channels", "duplex"),
          ("requests", "thinker"), ("kv_free_blocks", "thinker"), ("requests", "talker"),
          ("kv_free_blocks", "talker"), ("codec_states", "code2wav"), ("stranded_threads", "duplex"))


@dataclass
class Tally:
    """Shared by the workers (under `lock`) and read by the reporter."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: int = 0
    turns: int = 0
    barge_ins: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttfp: list[tuple[float, float]] = field(default_factory=list)  # (monotonic s, server ttfp ms)

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1


@dataclass(frozen=True)
class SoakConfig:
    url: str
    sessions: int
    minutes: float
    barge_in: float
    turns: int
    reply_units: int
    seed: int

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.minutes <= 0 or not 0.0 <= self.barge_in <= 1.0 or self.turns < 1:
            raise ValueError(f"bad soak configuration {self}")


class Worker:
    def __init__(self, config: SoakConfig, tally: Tally, index: int, deadline: float) -> None:
        self._config, self._tally, self._deadline = config, tally, deadline
        self._rng = random.Random(config.seed * 1000 + index)
        self._noise = np.random.default_rng(index)
        self._index = index

    def run(self) -> None:
        number = 0
        while time.monotonic() < self._deadline:
            number += 1
            try:
                self._session(f"soak-{self._index}-{number}")
            except (DuplexTimeout, DuplexStreamError, DuplexProtocolError) as exc:
                self._tally.error(type(exc).__name__)

    def _session(self, session_id: str) -> None:
        params = SessionParams(reply_units=self._config.reply_units, reply_tokens_per_unit=3,
                               seed=self._rng.randrange(1 << 30))
        with DuplexSession.connect(self._config.url, session_id=session_id) as session:
            session.start(params)
            if self._admitted(session):
                with self._tally.lock:
                    self._tally.sessions += 1
                for _ in range(self._config.turns):
                    if time.monotonic() >= self._deadline or not self._turn(session):
                        break
            session.end()  # sends nothing after a refused START: the server ended that sequence
            for event in session.drain(TURN_TIMEOUT_S):
                self._observe(event)

    def _admitted(self, session: DuplexSession) -> bool:
        """Wait for START's answer: no audio goes to a session the server refused."""
        event = session.next_event(TURN_TIMEOUT_S)
        if event is None:
            self._tally.error("downlink_closed_before_created")
            return False
        self._observe(event)
        return isinstance(event, SessionCreated)

    def _turn(self, session: DuplexSession) -> bool:
        """One user turn and the reply to it; False when the session is unusable."""
        next_send = time.monotonic()
        barge_at = None
        for index in range(int(TURN_TIMEOUT_S / APPEND_S)):
            if not session.downlink_open:
                return False
            session.append(self._chunk(speech=index < SPEECH_APPENDS))
            next_send += APPEND_S
            for event in session.events_until(next_send):
                outcome = self._observe(event)
                if outcome == "audio" and barge_at is None and self._rng.random() < self._config.barge_in:
                    barge_at = time.monotonic() + self._rng.uniform(0.2, 1.5)
                if outcome == "done":
                    return True
            if barge_at is not None and time.monotonic() >= barge_at:
                session.cancel()
                barge_at = float("inf")
                with self._tally.lock:
                    self._tally.barge_ins += 1
        self._tally.error("turn_timeout")
        return False

    def _chunk(self, speech: bool) -> np.ndarray:
        if not speech:
            return np.zeros(APPEND_SAMPLES, np.int16)
        return (self._noise.standard_normal(APPEND_SAMPLES) * 6000).clip(-32767, 32767).astype(np.int16)

    def _observe(self, event: object) -> str:
        if isinstance(event, AudioDelta):
            if event.ttfp_ms is not None:
                with self._tally.lock:
                    self._tally.ttfp.append((time.monotonic(), float(event.ttfp_ms)))
            return "audio"
        if isinstance(event, ResponseDone):
            if event.status == "failed":
                self._tally.error("response_failed")
            with self._tally.lock:
                self._tally.turns += 1
            return "done"
        if isinstance(event, ErrorEvent):
            self._tally.error(f"error:{event.code}")
        elif isinstance(event, RequestFailed):
            self._tally.error("request_failed")
        return ""


def tree_rss_mb(root_pid: int) -> float:
    """Resident memory of `root_pid` and all its descendants, in MiB (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total_kb, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total_kb / 1024.0


def gauges(metrics_url: str | None) -> dict[tuple[str, str], float]:
    if metrics_url is None:
        return {}
    try:
        with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=5) as response:
            return parse_gauges(response.read().decode())
    except OSError:
        return {}


class Reporter:
    def __init__(self, tally: Tally, every_s: float, server_pid: int | None, metrics_url: str | None) -> None:
        self._tally, self._every_s = tally, every_s
        self._pid, self._metrics_url = server_pid, metrics_url
        self.memory: list[tuple[float, float]] = []  # (elapsed s, MiB)
        self.windows: list[tuple[float, float]] = []  # (elapsed s, median ttfp ms)
        self._t0 = time.monotonic()

    def loop(self, stop: threading.Event) -> None:
        while not stop.wait(self._every_s):
            self.report()

    def report(self) -> None:
        now, elapsed = time.monotonic(), time.monotonic() - self._t0
        with self._tally.lock:
            recent = [ms for t, ms in self._tally.ttfp if now - t <= self._every_s]
            counts = (self._tally.sessions, self._tally.turns, self._tally.barge_ins, sum(self._tally.errors.values()))
        ttfp = statistics.median(recent) if recent else float("nan")
        if recent:
            self.windows.append((elapsed, ttfp))
        rss = tree_rss_mb(self._pid) if self._pid else float("nan")
        self.memory.append((elapsed, rss))
        held = gauges(self._metrics_url)
        held_text = " ".join(f"{name}.{model}={held[(name, model)]:.0f}" for name, model in GAUGES
                             if (name, model) in held)
        print(f"t={elapsed:6.0f}s sessions={counts[0]} turns={counts[1]} barge_ins={counts[2]} errors={counts[3]} "
              f"ttfp_p50={ttfp:7.1f}ms rss={rss:8.1f}MiB {held_text}", flush=True)


# What must be back at its idle value once every session ended (a leak otherwise).
IDLE_AT_END = (("sessions", "duplex"), ("session_threads", "duplex"), ("stranded_threads", "duplex"),
               ("requests", "thinker"), ("kv_free_blocks", "thinker"), ("requests", "talker"),
               ("kv_free_blocks", "talker"), ("codec_states", "code2wav"))
SETTLE_S = 20.0


def settled_gauges(metrics_url: str | None, start: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """The IDLE_AT_END gauges that still differ from `start` after up to SETTLE_S (sessions that
    sent END are still flushing their last audio for a moment)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = gauges(metrics_url)
        differ = {key: now.get(key) for key in IDLE_AT_END if key in start and now.get(key) != start[key]}
        if not differ or time.monotonic() > deadline:
            return differ
        time.sleep(0.5)


def summary(tally: Tally, reporter: Reporter, leftovers: dict[tuple[str, str], float]) -> int:
    print("---- soak summary")
    print(f"sessions={tally.sessions} turns={tally.turns} barge_ins={tally.barge_ins} "
          f"errors={sum(tally.errors.values())} {dict(sorted(tally.errors.items()))}")
    if len(reporter.windows) >= 2:
        xs = np.array([t for t, _ in reporter.windows]) / 60.0
        ys = np.array([ms for _, ms in reporter.windows])
        slope = float(np.polyfit(xs, ys, 1)[0])
        print(f"ttfp drift: first window p50 {ys[0]:.1f} ms, last window p50 {ys[-1]:.1f} ms, "
              f"slope {slope:+.1f} ms/min over {len(ys)} windows")
    memory = [mb for _, mb in reporter.memory if mb == mb]
    if memory:
        print(f"server memory: start {memory[0]:.1f} MiB, end {memory[-1]:.1f} MiB, max {max(memory):.1f} MiB, "
              f"growth {memory[-1] - memory[0]:+.1f} MiB")
    held = ", ".join(f"{name}.{model}={value}" for (name, model), value in leftovers.items())
    print(f"held after the last session: {held or 'nothing (every gauge back at its start value)'}")
    return 1 if tally.errors or leftovers else 0


def soak(config: SoakConfig, every_s: float, server_pid: int | None, metrics_url: str | None) -> int:
    tally = Tally()
    reporter = Reporter(tally, every_s, server_pid, metrics_url)
    start = gauges(metrics_url)
    reporter.report()
    deadline = time.monotonic() + 60.0 * config.minutes
    workers = [threading.Thread(target=Worker(config, tally, i, deadline).run, daemon=True)
               for i in range(config.sessions)]
    stop = threading.Event()
    monitor = threading.Thread(target=reporter.loop, args=(stop,), daemon=True)
    monitor.start()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    leftovers = settled_gauges(metrics_url, start)
    reporter.report()
    return summary(tally, reporter, leftovers)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--barge-in", type=float, default=0.3, help="probability of a barge-in per reply")
    parser.add_argument("--turns", type=int, default=4, help="user turns per session")
    parser.add_argument("--reply-units", type=int, default=4)
    parser.add_argument("--report-every", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", help="gRPC host:port of a running server (default: start a cpu server)")
    parser.add_argument("--metrics-url", help="http://host:port of its metrics endpoint")
    parser.add_argument("--server-pid", type=int, help="pid of its tritonserver (memory of the process tree)")
    parser.add_argument("--profile", default="cpu")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = lambda url: SoakConfig(url, args.sessions, args.minutes, args.barge_in, args.turns,  # noqa: E731
                                    args.reply_units, args.seed)
    if args.url:
        return soak(config(args.url), args.report_every, args.server_pid, args.metrics_url)
    from backends.serving.launcher import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    profile = get_profile(args.profile).with_overrides({"max_sessions": str(max(4, args.sessions))})
    with ServerProcess(ServerOptions(profile=profile)) as server:
        print(f"server ready: grpc {server.grpc_url}, log {server.log_file}", flush=True)
        return soak(config(server.grpc_url), args.report_every, server.process.pid,
                    f"http://{server.options.address}:{server.metrics_port}")


if __name__ == "__main__":
    sys.exit(main())
