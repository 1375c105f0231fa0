"""Soak test (not in CI): N concurrent real-time sessions for M minutes with random barge-ins,
clients that vanish, and a neighbour server that comes and goes.

    python -m perf.soak --sessions 4 --minutes 60 --barge-in 0.4 --drop 0.3 --neighbour-every-s 180
    python -m perf.soak --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002 --server-pid 1234

Each worker keeps one session open at a time: it streams 200 ms appends in real time (a
second of speech-like noise opens each user turn, silence follows), lets the model reply
(the reply-shape knobs force `--reply-units` speaking units), barges in (`cancel`) on a reply
with probability `--barge-in`, and starts a new session after `--turns` turns. With
probability `--drop` a session's client vanishes instead, at a random moment of a random turn:
its stream is cancelled without END, and the server must reap the session.

Without --url the soak starts its server through `minicpmo-server` (the launcher CLI), whose
supervisor restarts a server that died: the soak counts those restarts from the launcher's
output, and stub restarts from the stub pids of the tritonserver (and the kernel's segfault
lines where dmesg is readable). `--neighbour-every-s S` starts and stops a second server on
the same machine every S seconds (perf/soak_neighbour.py). `--pause-stubs-every-s S` stops one
of the server's stub processes, drawn at random, for `--pause-s` seconds every S seconds
(SIGSTOP, then SIGCONT: perf/soak_pauser.py), the stall that used to abort Triton.

Every `--report-every` seconds it prints one line and adds a window to the time series:
sessions, turns, barge-ins, drops, errors, the server TTFP p50 / p90 of the window, the
server's memory (RSS of its process tree), its stubs and what the stages hold (resource
gauges). At the end: errors by kind, TTFP drift, memory growth, server deaths, stub restarts,
neighbour cycles, and what the server still holds once the last session ended; the results
page <out>/<name>.md with .json and .png (perf/soak_report.py). Exit status 1 when any error,
server death, stub restart, neighbour failure or held resource was seen.
"""
from __future__ import annotations

import argparse
import datetime
import random
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.serving.resource_gauges import parse_gauges
from client.errors import DuplexProtocolError, DuplexStreamError, DuplexTimeout
from client.events import AudioDelta, ErrorEvent, RequestFailed, ResponseDone, SessionCreated
from client.params import SessionParams
from client.session import DuplexSession
from perf.soak_launcher import PROJECT_ROOT, LauncherServer
from perf.soak_neighbour import Neighbour, NeighbourTally
from perf.soak_pauser import StubPauser
from perf.soak_processes import StubSnapshot, kernel_log, segfaults, stub_restarts, tree_rss_mb
from perf.soak_report import ServerHealth, SoakResult, Window, held_text, ttfp_drift, write_json, write_results

APPEND_S = 0.2
APPEND_SAMPLES = 3200  # 200 ms at 16 kHz
SPEECH_APPENDS = 5  # one second of speech opens a user turn
MESSAGES_PER_KIND = 3  # the first error messages of each kind are printed as they come
DROP_APPENDS = 20  # a drop comes within the first 4 s of its turn: speech, reply or its audio
TURN_TIMEOUT_S = 30.0
ERROR_PAUSE_S = 1.0  # a worker's pause after a failed session (a restarting server refuses for a while)
READY_TIMEOUT_S = 300.0
GAUGES = (("sessions", "duplex"), ("session_threads", "duplex"), ("stage_channels", "duplex"),
          ("requests", "thinker"), ("kv_free_blocks", "thinker"), ("requests", "talker"),
          ("kv_free_blocks", "talker"), ("codec_states", "code2wav"), ("stranded_threads", "duplex"),
          *((gauge, stage) for gauge in ("cuda_peak_allocated_mib", "cuda_reserved_mib")
            for stage in ("thinker", "talker", "code2wav")))  # GPU stages only


@dataclass
class Tally:
    """Shared by the workers (under `lock`) and read by the reporter."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: int = 0
    turns: int = 0
    barge_ins: int = 0
    drops: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttfp: list[tuple[float, float]] = field(default_factory=list)  # (monotonic s, server ttfp ms)

    def error(self, kind: str, message: str = "") -> None:
        with self.lock:
            self.errors[kind] = seen = self.errors.get(kind, 0) + 1
        if message and seen <= MESSAGES_PER_KIND:
            print(f"{kind}: {message}", flush=True)

    def count(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


@dataclass(frozen=True)
class SoakConfig:
    url: str
    sessions: int
    minutes: float
    barge_in: float
    turns: int
    reply_units: int
    seed: int
    drop: float = 0.0

    def __post_init__(self) -> None:
        if (self.sessions < 1 or self.minutes <= 0 or not 0.0 <= self.barge_in <= 1.0 or self.turns < 1
                or not 0.0 <= self.drop <= 1.0):
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
                code = getattr(exc, "code", None)
                self._tally.error(type(exc).__name__ + (f":{code}" if code else ""))
                time.sleep(ERROR_PAUSE_S)

    def drop_point(self) -> tuple[int, int] | None:
        """(turn, append) at which this session's client vanishes, or None: it ends normally."""
        if self._rng.random() >= self._config.drop:
            return None
        return self._rng.randrange(self._config.turns), self._rng.randrange(1, DROP_APPENDS + 1)

    def _session(self, session_id: str) -> None:
        params = SessionParams(reply_units=self._config.reply_units, reply_tokens_per_unit=3,
                               seed=self._rng.randrange(1 << 30))
        drop = self.drop_point()
        with DuplexSession.connect(self._config.url, session_id=session_id) as session:
            session.start(params)
            if self._admitted(session):
                self._tally.count("sessions")
                for turn in range(self._config.turns):
                    if time.monotonic() >= self._deadline:
                        break
                    outcome = self._turn(session, drop[1] if drop and drop[0] == turn else None)
                    if outcome == "dropped":
                        # Leaving the block without END closes the session: its stream is
                        # cancelled (not settled), as when the client's process vanishes.
                        self._tally.count("drops")
                        return
                    if outcome != "done":
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

    def _turn(self, session: DuplexSession, drop_at: int | None) -> str:
        """One user turn and the reply to it: "done", "dropped" (after append `drop_at`) or
        "broken" (the session is unusable)."""
        next_send = time.monotonic()
        barge_at = None
        for index in range(int(TURN_TIMEOUT_S / APPEND_S)):
            if not session.downlink_open:
                return "broken"
            if index == drop_at:
                return "dropped"
            session.append(self._chunk(speech=index < SPEECH_APPENDS))
            next_send += APPEND_S
            for event in session.events_until(next_send):
                outcome = self._observe(event)
                if outcome == "audio" and barge_at is None and self._rng.random() < self._config.barge_in:
                    barge_at = time.monotonic() + self._rng.uniform(0.2, 1.5)
                if outcome == "done" and drop_at is None:
                    return "done"
            if barge_at is not None and time.monotonic() >= barge_at:
                session.cancel()
                barge_at = float("inf")
                self._tally.count("barge_ins")
        self._tally.error("turn_timeout")
        return "broken"

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
            self._tally.count("turns")
            return "done"
        if isinstance(event, ErrorEvent):
            self._tally.error(f"error:{event.code}", event.message)
        elif isinstance(event, RequestFailed):
            self._tally.error("request_failed")
        return ""


def gauges(metrics_url: str | None) -> dict[tuple[str, str], float]:
    if metrics_url is None:
        return {}
    try:
        with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=5) as response:
            return parse_gauges(response.read().decode())
    except OSError:
        return {}


@dataclass(frozen=True)
class ServerView:
    """Where the reporter looks: the tritonserver's pid now (a restart changes it; None: not
    known or not running) and its metrics endpoint."""

    pid: Callable[[], int | None]
    metrics_url: str | None


class Reporter:
    def __init__(self, tally: Tally, every_s: float, view: ServerView, neighbour: NeighbourTally | None,
                 on_window: Callable[[list[Window]], None] = lambda windows: None) -> None:
        self._tally, self._every_s, self._view = tally, every_s, view
        self._neighbour, self._on_window = neighbour, on_window
        self.windows: list[Window] = []
        self.stub_restarts = 0
        self.pids_seen: set[int] = set()  # every tritonserver and stub pid, for the kernel log
        self._stubs = StubSnapshot(None, frozenset())
        self._t0 = self.started_s = time.monotonic()  # the kernel log's clock too

    def loop(self, stop: threading.Event) -> None:
        while not stop.wait(self._every_s):
            self.report()

    def report(self) -> Window:
        window = self._window(time.monotonic())
        self.windows.append(window)
        held = " ".join(f"{key}={value:.0f}" for key, value in window.held.items())
        print(f"t={window.t_s:6.0f}s sessions={window.sessions} turns={window.turns} barge_ins={window.barge_ins} "
              f"drops={window.drops} errors={window.errors} ttfp_p50={_ms(window.ttfp_p50_ms)} "
              f"p90={_ms(window.ttfp_p90_ms)} rss={_ms(window.rss_mib)}MiB stubs={window.stubs} "
              f"stub_restarts={self.stub_restarts} {held}", flush=True)
        self._on_window(self.windows)
        return window

    def _window(self, now: float) -> Window:
        with self._tally.lock:
            recent = [ms for t, ms in self._tally.ttfp if now - t <= self._every_s]
            t = self._tally
            counts = (t.sessions, t.turns, t.barge_ins, t.drops, sum(t.errors.values()))
        pid = self._view.pid()
        stubs = self._watch_stubs(pid)
        metrics = gauges(self._view.metrics_url)
        return Window(
            round(now - self._t0, 1), *counts,
            float(np.percentile(recent, 50)) if recent else None, float(np.percentile(recent, 90)) if recent else None,
            tree_rss_mb(pid) if pid else None, len(stubs.stubs) if pid else None, self.stub_restarts, pid,
            self._neighbour.ran_since_last_look() if self._neighbour else False,
            {f"{name}.{model}": metrics[(name, model)] for name, model in GAUGES if (name, model) in metrics})

    def _watch_stubs(self, pid: int | None) -> StubSnapshot:
        snapshot = StubSnapshot.of(pid)
        self.stub_restarts += stub_restarts(self._stubs, snapshot)
        self._stubs = snapshot
        self.pids_seen |= snapshot.stubs | ({pid} if pid else set())
        return snapshot


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# What must be back at its idle value once every session ended (a leak otherwise).
IDLE_AT_END = (("sessions", "duplex"), ("session_threads", "duplex"), ("stranded_threads", "duplex"),
               ("requests", "thinker"), ("kv_free_blocks", "thinker"), ("requests", "talker"),
               ("kv_free_blocks", "talker"), ("codec_states", "code2wav"))
SETTLE_S = 20.0


def settled_gauges(metrics_url: str | None, start: dict[tuple[str, str], float]) -> dict[str, float]:
    """The IDLE_AT_END gauges that still differ from `start` after up to SETTLE_S (sessions that
    sent END are still flushing their last audio for a moment; dropped ones wait to be reaped)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = gauges(metrics_url)
        differ = {f"{name}.{model}": now.get((name, model), float("nan")) for name, model in IDLE_AT_END
                  if (name, model) in start and now.get((name, model)) != start[(name, model)]}
        if not differ or time.monotonic() > deadline:
            return differ
        time.sleep(0.5)


@dataclass
class SoakRun:
    """What one soak gathered; the caller adds the server's health and the neighbour's tally."""

    tally: Tally
    reporter: Reporter
    held_at_end: dict[str, float]


def soak(config: SoakConfig, every_s: float, view: ServerView, neighbour: Neighbour | None = None,
         on_window: Callable[[list[Window]], None] = lambda windows: None,
         pauser: StubPauser | None = None) -> SoakRun:
    tally = Tally()
    reporter = Reporter(tally, every_s, view, neighbour.tally if neighbour else None, on_window)
    start = gauges(view.metrics_url)
    reporter.report()
    stop = threading.Event()
    helpers = [threading.Thread(target=reporter.loop, args=(stop,), daemon=True)]
    if neighbour is not None:
        helpers.append(threading.Thread(target=neighbour.run, args=(stop,), name="neighbour", daemon=True))
    if pauser is not None:
        pauser.server_pid = view.pid
        helpers.append(threading.Thread(target=pauser.run, args=(stop,), name="stub-pauser", daemon=True))
    deadline = time.monotonic() + 60.0 * config.minutes
    workers = [threading.Thread(target=Worker(config, tally, i, deadline).run, daemon=True)
               for i in range(config.sessions)]
    for thread in [*helpers, *workers]:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    for thread in helpers:
        thread.join()
    held = settled_gauges(view.metrics_url, start)
    reporter.report()
    return SoakRun(tally, reporter, held)


def print_summary(result: SoakResult) -> None:
    print("---- soak summary")
    print(f"sessions={result.sessions} turns={result.turns} barge_ins={result.barge_ins} drops={result.drops} "
          f"errors={sum(result.errors.values())} {dict(sorted(result.errors.items()))}")
    server = result.server
    if server.watched:
        print(f"server deaths={server.deaths} ready_again={server.ready_again} failed_restarts="
              f"{server.failed_restarts} stub_restarts={server.stub_restarts} segfaults={len(server.segfaults)}")
    if result.neighbour is not None:
        print(f"neighbour cycles={result.neighbour['cycles']} failures={result.neighbour['failures']}")
    if result.pauses is not None:
        print(f"stub pauses={result.pauses['pauses']} {result.pauses['by_model']} failures={result.pauses['failures']}")
    drift = ttfp_drift(result.windows)
    if drift is not None:
        print(f"ttfp drift: first p50 {drift.first_ms:.1f} ms, last p50 {drift.last_ms:.1f} ms, {drift.pct:+.1f} % "
              f"(slope {drift.slope_ms_per_min:+.2f} ms/min; {drift.basis}: {drift.windows})")
    rss = [w.rss_mib for w in result.windows if w.rss_mib is not None]
    if rss:
        print(f"server memory: start {rss[0]:.1f} MiB, end {rss[-1]:.1f} MiB, max {max(rss):.1f} MiB, "
              f"growth {rss[-1] - rss[0]:+.1f} MiB")
    print(f"held after the last session: {held_text(result.held_at_end) or 'nothing'}")
    print("verdict: " + ("; ".join(result.problems()) or "pass"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--barge-in", type=float, default=0.3, help="probability of a barge-in per reply")
    parser.add_argument("--drop", type=float, default=0.0,
                        help="probability per session that its client vanishes mid-session (no END)")
    parser.add_argument("--turns", type=int, default=4, help="user turns per session")
    parser.add_argument("--reply-units", type=int, default=4)
    parser.add_argument("--report-every", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", help="gRPC host:port of a running server (default: start a server "
                                      "through the launcher CLI)")
    parser.add_argument("--metrics-url", help="http://host:port of its metrics endpoint")
    parser.add_argument("--server-pid", type=int, help="pid of its tritonserver (memory of the process tree)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="configuration variable of the server started here (launcher --set)")
    parser.add_argument("--neighbour-every-s", type=float,
                        help="start and stop a second server every S seconds (up for S/2)")
    parser.add_argument("--pause-stubs-every-s", type=float,
                        help="stop one of the server's stubs (at random) for --pause-s seconds every S seconds")
    parser.add_argument("--pause-s", type=float, default=3.0, help="length of a stub pause")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "perf" / "results",
                        help="directory of the results page")
    parser.add_argument("--name", help="page name (default: soak_<profile>)")
    parser.add_argument("--log-dir", type=Path, default=PROJECT_ROOT / "perf" / "out" / "soak",
                        help="launcher output and server logs of the servers started here")
    return parser.parse_args(argv)


def run_meta(args: argparse.Namespace, argv: list[str]) -> dict[str, object]:
    from perf.duplex_bench import describe_device

    neighbour = f", neighbour server every {args.neighbour_every_s:g} s" if args.neighbour_every_s else ""
    if args.pause_stubs_every_s:
        neighbour += f", a stub paused {args.pause_s:g} s every {args.pause_stubs_every_s:g} s"
    return {
        "command": "python -m perf.soak " + shlex.join(argv), "commit": git_commit(), "device": describe_device(),
        "profile": f"{args.profile} (server started separately)" if args.url else args.profile,
        "workload": (f"{args.sessions} sessions, {args.turns} turns each, replies of {args.reply_units} units, "
                     f"barge-in {args.barge_in:g}, drop {args.drop:g}{neighbour}, report every "
                     f"{args.report_every:g} s, seed {args.seed}"),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "minutes": args.minutes,
    }


def git_commit() -> str:
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (uncommitted changes)" if dirty else "")


def page_title(args: argparse.Namespace) -> str:
    extras = [name for name, on in (("barge-ins", args.barge_in > 0), ("client drops", args.drop > 0),
                                    ("a neighbour server", bool(args.neighbour_every_s)),
                                    ("stub pauses", bool(args.pause_stubs_every_s))) if on]
    listed = " and ".join([", ".join(extras[:-1]), extras[-1]] if len(extras) > 1 else extras)
    return (f"Soak, {args.profile} profile: {args.sessions} sessions for {args.minutes:g} min"
            + (f" with {listed}" if listed else ""))


def session_headroom(args: argparse.Namespace) -> list[str]:
    """`--set max_sessions` for the server started here: room for the workers' sessions and for
    dropped ones the server has not reaped yet (a multiple of the `duplex` instances)."""
    from backends.serving.profiles import get_profile

    profile = get_profile(args.profile)
    wanted = args.sessions * (2 if args.drop > 0 else 1)
    per = profile.duplex_instances
    return [f"max_sessions={max(profile.max_sessions, -(-wanted // per) * per)}"]


def pid_if_alive(pid: int | None) -> int | None:
    return pid if pid and Path(f"/proc/{pid}").exists() else None


def kernel_health(pids: set[int], since_s: float) -> tuple[tuple[str, ...], bool]:
    log = kernel_log()
    return (tuple(segfaults(log, pids, since_s)) if log else ()), log is not None


def soak_server_given(args: argparse.Namespace, config: SoakConfig, neighbour: Neighbour | None,
                      on_window: Callable[[list[Window]], None],
                      pauser: StubPauser | None = None) -> tuple[SoakRun, ServerHealth]:
    view = ServerView(lambda: pid_if_alive(args.server_pid), args.metrics_url)
    run = soak(config, args.report_every, view, neighbour, on_window, pauser)
    found, read = kernel_health(run.reporter.pids_seen, run.reporter.started_s)
    return run, ServerHealth(watched=False, stub_restarts=run.reporter.stub_restarts, segfaults=found,
                             kernel_log_read=read)


def soak_own_server(args: argparse.Namespace, make_config: Callable[[str], SoakConfig], neighbour: Neighbour | None,
                    on_window: Callable[[list[Window]], None],
                    pauser: StubPauser | None = None) -> tuple[SoakRun, ServerHealth]:
    server = LauncherServer(args.profile, [*session_headroom(args), *args.set], args.log_dir, "server")
    try:
        server.start(READY_TIMEOUT_S)
        print(f"server ready: grpc {server.grpc_url}, launcher output {server.output}, log {server.triton_log}",
              flush=True)
        run = soak(make_config(server.grpc_url), args.report_every, ServerView(server.tritonserver_pid,
                                                                              server.metrics_url),
                   neighbour, on_window, pauser)
        launcher_exit = server.exit_code()  # None: still supervising, as it should be
    finally:
        server.stop()
    events = server.events()
    found, read = kernel_health(run.reporter.pids_seen, run.reporter.started_s)
    return run, ServerHealth(True, events.restarts, len(events.ready_again_s), events.failed_restarts,
                             events.given_up, launcher_exit, run.reporter.stub_restarts, found, read)


def as_result(meta: dict[str, object], windows: list[Window], run: SoakRun | None = None,
              server: ServerHealth | None = None, neighbour: Neighbour | None = None,
              pauser: StubPauser | None = None) -> SoakResult:
    """The record so far (from the last window's totals) or, given the run, the final one."""
    if run is None:
        last = windows[-1]
        return SoakResult(dict(meta), list(windows), last.sessions, last.turns, last.barge_ins, last.drops)
    t = run.tally
    return SoakResult(dict(meta), list(windows), t.sessions, t.turns, t.barge_ins, t.drops, dict(t.errors),
                      server or ServerHealth(watched=False), neighbour.tally.to_json() if neighbour else None,
                      run.held_at_end, pauser.tally.to_json() if pauser else None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    name = args.name or f"soak_{args.profile}"
    meta = run_meta(args, argv)
    make_config = lambda url: SoakConfig(url, args.sessions, args.minutes, args.barge_in,  # noqa: E731
                                         args.turns, args.reply_units, args.seed, args.drop)
    make_config("")  # a bad configuration fails before any server starts
    neighbour = Neighbour(args.neighbour_every_s, args.profile, args.log_dir) if args.neighbour_every_s else None
    pauser = StubPauser(args.pause_stubs_every_s, args.pause_s, args.seed) if args.pause_stubs_every_s else None
    on_window = lambda windows: write_json(args.out / f"{name}.json", as_result(meta, windows))  # noqa: E731
    if args.url:
        run, server = soak_server_given(args, make_config(args.url), neighbour, on_window, pauser)
    else:
        run, server = soak_own_server(args, make_config, neighbour, on_window, pauser)
    result = as_result(meta, run.reporter.windows, run, server, neighbour, pauser)
    written = write_results(args.out, name, page_title(args), result)
    print_summary(result)
    print("wrote " + ", ".join(str(path) for path in written))
    return 1 if result.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
