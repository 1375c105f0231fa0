"""Property-based bad input for the public gRPC front door (not in CI; CI runs a subset:
tests/server/test_duplex_fuzz.py).

    python -m perf.fuzz_duplex --cases 1000 --seed 7              # starts its own cpu server
    python -m perf.fuzz_duplex --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002 --cases 1000 --seed 7

Draws `--cases` cases from perf/fuzz_inputs.py (malformed AUDIO/REF_AUDIO, missing and unknown
inputs, sequence flags, session ids, request parameters, bad appends among valid ones on a live
session, stage requests without the stage secret) and checks each against the server: every
request gets what the contract says (perf/fuzz_oracle.py), every error is clear (a message, no
`internal` code, no traceback), the server stays ready and the fuzz session survives whatever
did not END it. A canary session opened before the batch must complete a reply turn after it,
and then the resource gauges must be back at the idle baseline (no session, no stage request,
no KV block in use). Prints cases and outcomes per category and each failure with its seed and
case; exits 1 on any failure. The checks assume the default limits of the contract.
"""
from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from backends.serving.resource_gauges import parse_gauges
from perf.fuzz_inputs import STAGES, Case, Step, cases
from perf.fuzz_oracle import EITHER, ERROR, FORBIDDEN, OK, expect
from perf.fuzz_wire import Outcome, Session, Wire, stage_inputs, stage_parameters, tensor_inputs

UNIT = 16000
HEARTBEAT_S = 5.0  # the canary's keep-alive append: far below any idle timeout
OUR_CODES = ("invalid_argument", "resource_exhausted", "session_not_found", "session_exists", "forbidden")
# Counts that must return to their idle values (the duplex process's thread count included).
TRACKED = (("sessions", "duplex"), ("session_threads", "duplex"), ("threads", "duplex"), ("uplink_audio_ms", "duplex"),
           ("requests", "thinker"), ("runner_requests", "thinker"), ("kv_free_blocks", "thinker"),
           ("requests", "talker"), ("runner_requests", "talker"), ("kv_free_blocks", "talker"),
           ("requests", "code2wav"), ("codec_states", "code2wav"), ("codec_pending", "code2wav"))
ZERO_WHEN_IDLE = tuple(key for key in TRACKED if key[0] not in ("threads", "kv_free_blocks"))
SETTLE_S = 60.0


def _holds_more(key: tuple[str, str], now: float | None, baseline: float | None) -> bool:
    """Whether the server holds more than at the idle baseline: fewer threads is fine (idle stage
    channels close), fewer free KV blocks is not."""
    if now is None or baseline is None:
        return now != baseline
    if key[0] == "threads":
        return now > baseline
    if key[0] == "kv_free_blocks":
        return now < baseline
    return now != baseline
REPLY = {"reply_units": 1, "reply_tokens_per_unit": 2}


@dataclass
class Report:
    cases: Counter = field(default_factory=Counter)  # per category
    outcomes: Counter = field(default_factory=Counter)  # (category, outcome kind)
    failures: list[str] = field(default_factory=list)


def clarity_problem(message: str) -> str | None:
    """Why an error message is not a clear answer to a bad request, None when it is."""
    if not message.strip():
        return "an empty error message"
    if "Traceback (most recent call last)" in message or "[internal]" in message:
        return "an internal error (a bug of the server)"
    code = message[1:].partition("]")[0] if message.startswith("[") else ""
    if code and " " not in code and ":" not in code and code not in OUR_CODES:
        return f"an unknown error code [{code}]"
    return None


class Harness:
    """Runs cases against one server; holds the canary, the fuzz session and a side wire."""

    def __init__(self, url: str, metrics_url: str | None, stage_secret: str | None = None,
                 alive=lambda: True) -> None:
        self.url, self.metrics_url, self._secret, self._alive = url, metrics_url, stage_secret, alive
        self.report = Report()
        self._run = f"fz{int(time.time()) % 100000}"
        self._count = 0
        self._used_ids: set[object] = set()
        self._finished: list[str] | None = None
        self.baseline = self._warm_baseline()
        self.canary = Session(url, f"{self._run}-canary", **REPLY)
        self._beat = time.monotonic()
        self.live = self._open_live()
        self.side = Wire(url)

    # ---- one case ----------------------------------------------------------------------------

    def run(self, case: Case, label: str = "") -> str | None:
        """Send the case's steps; the first broken property, or None."""
        self._count += 1
        self.report.cases[case.category] += 1
        problem = None
        for step in case.steps:
            problem = problem or self._step(case.category, step)
        problem = problem or self._heartbeat() or self._server_problem()
        if problem:
            self.report.failures.append(f"{label or self._count}: {problem}\n    {case!r}")
        return problem

    def _step(self, category: str, step: Step) -> str | None:
        sid = self._session_id(step)
        reused = sid in self._used_ids
        if step.start:
            self._used_ids.add(sid)
        wanted = expect(step, reused)
        outcome = self._send(step, sid)
        self.report.outcomes[(category, outcome.kind)] += 1
        problem = _judge(wanted, outcome)
        if step.target == "live":
            problem = problem or self._check_live(step)
        return f"{problem}: got {outcome.kind} {outcome.message[:300]!r}" if problem else None

    def _session_id(self, step: Step) -> object:
        if step.target == "live":
            return self.live.session_id
        if step.session_id is not None:
            return step.session_id
        return f"{self._run}-{step.target}-{self._count}"

    def _send(self, step: Step, sid: object) -> Outcome:
        params = step.param_dict or None
        if step.target in STAGES:
            inputs = stage_inputs(step, f"{self._run}-stage-{self._count}.e0")
            return self.side.answer(self.side.send(step.target, inputs,
                                                   parameters=stage_parameters(step.secret, self._secret)))
        inputs = tensor_inputs(step.tensors)
        if step.target == "live":
            return self.live.request(inputs, step.start, step.end, params)
        request_id = self.side.send("duplex", inputs, sequence_id=sid, sequence_start=step.start,
                                    sequence_end=step.end, parameters=params)
        if not step.start:
            return self.side.answer(request_id)
        return self._fresh_start(request_id, sid, step.end)

    def _fresh_start(self, request_id: str, sid: object, ended: bool) -> Outcome:
        """A START on the side wire: a created session is ENDed at once, and its downlink must close."""
        first = self.side.first(request_id)
        if first is None:
            return Outcome("timeout", "no answer to a START")
        if first.error is not None:
            return Outcome("failed", first.error)
        created = first.event is not None and first.event.get("type") == "session.created"
        if created and not ended:
            end_answer = self.side.answer(self.side.send("duplex", [], sequence_id=sid, sequence_end=True))
            if end_answer.kind != "ok":
                return Outcome("timeout", f"the END of a fresh session got {end_answer.kind}: {end_answer.message}")
        rest = self.side.answer(request_id)
        if rest.kind in ("timeout", "failed"):
            return rest
        events = ([first.event] if first.event else []) + rest.events
        if created:
            return Outcome("created", events=events)
        return Outcome("refused", f"[{events[0].get('code')}] {events[0].get('message')}" if events else "", events)

    def _check_live(self, step: Step) -> str | None:
        """The fuzz session survives every step that did not END it; an ENDed one closes."""
        if not (step.end or step.start):
            return None
        probe = self.live.append()
        if probe.kind == "ok":
            return "the fuzz session is still open after its END" if step.end and _ended(self.live) else None
        if not self.live.wait_closed():  # no END: Triton ended the sequence already
            return "the fuzz session's downlink never closed"
        self.live.close()
        self.live = self._open_live()
        return None if step.end else "a START for an open session id ended that session"

    # ---- the server ----------------------------------------------------------------------------

    def _heartbeat(self) -> str | None:
        if time.monotonic() - self._beat < HEARTBEAT_S:
            return None
        self._beat = time.monotonic()
        for name, session in (("canary", self.canary), ("fuzz", self.live)):
            outcome = session.append()
            if outcome.kind != "ok":
                return f"the {name} session failed a keep-alive: {outcome.kind} {outcome.message[:200]!r}"
        return None

    def _server_problem(self) -> str | None:
        if not self._alive():
            return "the server process died"
        try:
            if not (self.side.client.is_server_ready() and self.side.client.is_model_ready("duplex")):
                return "the server is not ready"
        except Exception as exc:  # a server that does not answer is not ready
            return f"the server does not answer readiness: {exc}"
        return None

    def _open_live(self) -> Session:
        self._count += 1
        return Session(self.url, f"{self._run}-live-{self._count}")

    def finish(self) -> list[str]:
        """The canary's turn, the sessions' ENDs, then the gauges against the idle baseline (once)."""
        if self._finished is not None:
            return self._finished
        problems: list[str] = []
        self.canary.append(speech_units(1))
        self.canary.append(np.zeros(2 * UNIT, np.int16))
        done = self.canary.wait_for("response.done")
        if done is None or done.get("status") != "completed":
            problems.append(f"the canary did not complete a turn after the batch: {done}")
        for session in (self.canary, self.live):
            if not session.end():
                problems.append(f"session {session.session_id}: no downlink FINAL after END")
            session.close()
        self.side.close()
        problems += self._leftovers()
        self.report.failures += problems
        self._finished = problems
        return problems

    def _leftovers(self) -> list[str]:
        if self.metrics_url is None:
            return []
        deadline = time.monotonic() + SETTLE_S
        while True:
            now = self._tracked()
            held = [key for key, value in self.baseline.items() if _holds_more(key, now[key], value)]
            if not held or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        return [f"{name}{{model={model}}} is {now[(name, model)]}, idle baseline {self.baseline[(name, model)]}"
                for name, model in held]

    def _tracked(self) -> dict[tuple[str, str], float | None]:
        with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=5) as response:
            gauges = parse_gauges(response.read().decode())
        return {key: gauges.get(key) for key in TRACKED}

    def _warm_baseline(self) -> dict[tuple[str, str], float | None]:
        """One reply turn through all three stages, then the gauges once idle and steady."""
        warm = Session(self.url, f"{self._run}-warm", initial_user_text="hi", **REPLY)
        warm.append(np.zeros(2 * UNIT, np.int16))
        warm.wait_for("response.done")
        warm.end()
        warm.close()
        if self.metrics_url is None:
            return {}
        deadline, previous = time.monotonic() + SETTLE_S, None
        while True:
            time.sleep(0.6)  # longer than the orchestrator's gauge period
            now = self._tracked()
            idle = None not in now.values() and all(now[key] == 0 for key in ZERO_WHEN_IDLE)
            if (idle and now == previous) or time.monotonic() > deadline:
                return now
            previous = now


def _judge(wanted: str, outcome: Outcome) -> str | None:
    kind = outcome.kind
    if kind == "timeout":
        return "no answer (a hang)"
    if kind in ("failed", "refused"):
        unclear = clarity_problem(outcome.message)
        if unclear:
            return unclear
    if wanted == EITHER:
        return None
    if wanted == FORBIDDEN:
        return None if kind == "failed" and "[forbidden]" in outcome.message else "expected [forbidden]"
    if wanted == ERROR:
        return None if kind in ("failed", "refused") else "expected an error"
    if kind in ("ok", "created"):
        return None
    if kind == "failed" and outcome.message.startswith("[resource_exhausted]"):
        return None  # a valid append past the uplink bound: refused by contract
    return "expected a normal answer"


def _ended(session: Session) -> bool:
    return session.closed or any(event.get("type") == "session.closed" for event in session.events)


def speech_units(count: int, seed: int = 0) -> np.ndarray:
    """Loud noise that the Thinker's speech detector takes for speech."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count * UNIT) * 6000).clip(-32767, 32767).astype(np.int16)


def run_batch(harness: Harness, count: int, seed: int, conflicting_starts: bool = True) -> None:
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(case=cases(conflicting_starts))
    def one(case: Case) -> None:
        harness.run(case, label=f"seed {seed} case {harness.report.cases.total() + 1}")

    one()


def print_report(report: Report, seed: int, elapsed_s: float) -> None:
    print(f"seed {seed}: {report.cases.total()} cases in {elapsed_s:.0f} s")
    for category, count in sorted(report.cases.items()):
        kinds = ", ".join(f"{kind} {n}" for (cat, kind), n in sorted(report.outcomes.items()) if cat == category)
        print(f"  {category:15s} {count:5d} cases   {kinds}")
    print(f"failures: {len(report.failures)}")
    for failure in report.failures:
        print(f"  {failure}")


def fuzz(url: str, metrics_url: str | None, count: int, seed: int, stage_secret: str | None = None,
         alive=lambda: True, conflicting_starts: bool = True) -> int:
    began = time.monotonic()
    harness = Harness(url, metrics_url, stage_secret, alive)
    try:
        run_batch(harness, count, seed, conflicting_starts)
    finally:
        harness.finish()
    print_report(harness.report, seed, time.monotonic() - began)
    return 1 if harness.report.failures else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", help="gRPC host:port of a running server (default: start a cpu server)")
    parser.add_argument("--metrics-url", help="http://host:port of its metrics endpoint (the leftover check)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--without-conflicting-starts", action="store_true",
                        help="leave out STARTs for an open session's id (perf.fuzz_inputs.cases says why)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.url:
        return fuzz(args.url, args.metrics_url, args.cases, args.seed,
                    conflicting_starts=not args.without_conflicting_starts)
    from backends.serving.server_process import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    options = ServerOptions(profile=get_profile(args.profile), extra_args=["--exit-timeout-secs=5"])
    with ServerProcess(options) as server:
        metrics = f"http://{server.options.address}:{server.metrics_port}"
        return fuzz(server.grpc_url, metrics, args.cases, args.seed, server.stage_secret,
                    alive=lambda: server.process.poll() is None,
                    conflicting_starts=not args.without_conflicting_starts)


if __name__ == "__main__":
    sys.exit(main())
