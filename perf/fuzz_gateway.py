"""Property-based bad input for the WebSocket gateway's front doors (not in CI; CI runs a subset:
tests/gateway/test_gateway_fuzz.py).

    python -m perf.fuzz_gateway --cases 1000 --seed 7          # starts its own cpu server and gateway
    python -m perf.fuzz_gateway --gateway-url ws://127.0.0.1:8080 --api-key KEY \\
        --metrics-url http://127.0.0.1:8002 --cases 1000 --seed 7

Draws `--cases` connections from perf/fuzz_gateway_inputs.py over both protocols (Realtime V1 and
the demo's duplex protocol): malformed JSON, wrong field types, unknown and missing `type`,
events out of order, bad base64 and NaN audio, audio far ahead of real time, oversize and
binary frames, huge system prompts, out-of-range config values, bad voice clips, wrong
subprotocols, keys, origins and path ids, abrupt disconnects. Each must get what docs/gateway.md
says (perf/fuzz_gateway_oracle.py): a refusal at the handshake, or exactly the documented error
codes and then the session's end, never a hang, an undocumented code or traceback text. A canary
Realtime session opened before the batch must complete a reply turn after it; then the gateway's
session and queue gauges and the server's resource gauges must be back at idle. Prints cases
and outcomes per category and each failure with its seed and case; exits 1 on any failure.
The gateway must run with the settings `launch_gateway` gives it (the CI fixture's).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from backends.serving.resource_gauges import parse_gauges
from perf.fuzz_duplex import ZERO_WHEN_IDLE, Report, print_report
from perf.fuzz_gateway_inputs import REALTIME, GatewayCase, b64_float32, gateway_cases
from perf.fuzz_gateway_oracle import ANY_STATUS, DOCUMENTED, MAX_MESSAGE_BYTES, SESSION_DEFAULTS, Expectation, expect
from perf.fuzz_gateway_wire import Answer, run_case

UNIT = 16000
SETTLE_S = 60.0
GATEWAY_IDLE = ('minicpmo_gateway_sessions{protocol="realtime"}', 'minicpmo_gateway_sessions{protocol="demo"}',
                "minicpmo_gateway_queue_length")
UNCLEAR = ("Traceback (most recent call last)", "[internal]", "Internal Server Error")


def judge(wanted: Expectation, got: Answer) -> str | None:
    """The first way `got` breaks the documentation, None when it keeps it."""
    for text in got.raw:
        if any(marker in text for marker in UNCLEAR):
            return f"internal error text: {text[:300]!r}"
    if got.ended == "timeout":
        return "no end of the session in time (a hang)"
    if wanted.status == ANY_STATUS and got.status is not None:
        return None if got.status == 404 else f"refused with {got.status}, expected 404 or a session"
    if wanted.status != got.status and wanted.status != ANY_STATUS:
        return f"handshake status {got.status}, expected {wanted.status}"
    if got.status is not None:
        return None
    codes = got.codes()
    for event in got.events:
        if event.get("type") == "error" and not str(event.get("message") or (event.get("error") or {})
                                                    .get("message") or "").strip():
            return "an error without a message"
    if any(code not in DOCUMENTED for code in codes):
        return f"undocumented error codes {codes}"
    if got.ended == "disconnected":
        return None
    if tuple(codes) != wanted.codes:
        return f"error codes {codes}, expected {list(wanted.codes)}"
    if wanted.dropped and got.ended != "socket":
        return "a frame past the hard limit did not close the connection"
    return None


class Canary:
    """A Realtime session held open across the batch, kept alive at real time."""

    def __init__(self, url: str, key: str) -> None:
        self.ws = connect(f"{url}/v1/realtime?mode=audio&model=canary", subprotocols=["map.realtime"],
                          additional_headers={"Authorization": f"Bearer {key}"}, max_size=None, open_timeout=60)
        self.events: list[dict] = []
        self._wait("session.queue_done")
        self.ws.send(json.dumps({"type": "session.init", "payload": {}}))
        self._wait("session.created")
        self._sent_s, self._began = 0.0, time.monotonic()

    def keep_alive(self) -> None:
        """Silence up to real time (never ahead of it, at most 2 s at once: the gateway counts from
        the first audio), and the messages that came meanwhile."""
        due = time.monotonic() - self._began - self._sent_s
        if due >= 1.0:
            self._append(np.zeros(int(min(due, 2.0) * UNIT), np.float32))
        self._drain(0.0)

    def reply_turn(self, timeout_s: float = 90.0) -> dict | None:
        """A second of speech, then silence at real time until a reply completes; its response.done."""
        speech = (np.random.default_rng(0).standard_normal(UNIT) * 0.2).clip(-1, 1).astype(np.float32)
        chunk, began = UNIT // 10, time.monotonic()
        self.events.clear()
        for step in range(int(timeout_s * 10)):
            part = speech[step * chunk:(step + 1) * chunk] if step < 10 else np.zeros(chunk, np.float32)
            self._append(part)
            self._drain(max(0.0, began + (step + 1) / 10 - time.monotonic()))
            done = next((event for event in self.events if event.get("type") == "response.done"), None)
            if done is not None or any(event.get("type") == "session.closed" for event in self.events):
                return done
        return None

    def close(self) -> None:
        self.ws.send(json.dumps({"type": "session.close", "reason": "canary"}))
        self._wait("session.closed", 30.0)
        self.ws.close()

    def _append(self, samples: np.ndarray) -> None:
        self.ws.send(json.dumps({"type": "input.append", "input": {"audio": b64_float32(samples)}}))
        self._sent_s += samples.size / UNIT

    def _drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=max(0.0, deadline - time.monotonic()))))
            except TimeoutError:
                return

    def _wait(self, kind: str, timeout_s: float = 60.0) -> dict | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                event = json.loads(self.ws.recv(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                return None
            self.events.append(event)
            if event.get("type") == kind:
                return event
            if event.get("type") in ("error", "session.closed"):
                raise RuntimeError(f"the canary session ended: {event}")
        return None


class GatewayHarness:
    def __init__(self, url: str, key: str, server_metrics_url: str | None, alive=lambda: True) -> None:
        self.url, self.key, self.metrics_url, self._alive = url, key, server_metrics_url, alive
        self.http = url.replace("ws://", "http://").replace("wss://", "https://")
        self.report = Report()
        self.canary = Canary(url, key)

    def run(self, case: GatewayCase, label: str) -> str | None:
        self.report.cases[case.category] += 1
        got = run_case(self.url, case, self.key)
        self.report.outcomes[(case.category, f"{got.status or got.ended}")] += 1
        problem = judge(expect(case), got) or self._alive_problem() or self._canary_problem()
        if problem:
            self.report.failures.append(f"{label}: {problem}\n    {case!r}\n    got {got.events[-4:]!r} {got.closed_by}"[:2000])
        return problem

    def _canary_problem(self) -> str | None:
        try:
            self.canary.keep_alive()
        except ConnectionClosed as err:
            return f"the canary's connection closed: {err}; its last events {self.canary.events[-3:]}"
        ended = [event for event in self.canary.events if event.get("type") in ("error", "session.closed")]
        return f"the canary session ended: {ended[0]}" if ended else None

    def _alive_problem(self) -> str | None:
        if not self._alive():
            return "the server or the gateway process died"
        try:
            self.gateway_gauges()
        except OSError as err:
            return f"the gateway does not answer: {err}"
        return None

    def gateway_gauges(self) -> dict[str, float]:
        text = urllib.request.urlopen(f"{self.http}/metrics", timeout=5).read().decode()
        return {name: float(value) for name, _, value in
                (line.rpartition(" ") for line in text.splitlines() if line and not line.startswith("#"))}

    def finish(self) -> list[str]:
        problems = []
        try:
            done = self.canary.reply_turn()
        except ConnectionClosed as err:
            done = f"the canary's connection closed: {err}; its last events {self.canary.events[-3:]}"
        if not isinstance(done, dict) or (done.get("response") or {}).get("status") != "completed":
            problems.append(f"the canary did not complete a reply turn after the batch: {done}")
        with contextlib.suppress(ConnectionClosed):
            self.canary.close()
        problems += self._leftovers()
        self.report.failures += problems
        return problems

    def _leftovers(self) -> list[str]:
        deadline, held = time.monotonic() + SETTLE_S, {}
        while time.monotonic() < deadline:
            gauges = self.gateway_gauges()
            held = {name: gauges.get(name, 0.0) for name in GATEWAY_IDLE if gauges.get(name, 0.0)}
            held.update(self._server_held())
            if not held:
                return []
            time.sleep(0.25)
        return [f"{name} is {value} after the batch, idle is 0" for name, value in held.items()]

    def _server_held(self) -> dict[str, float]:
        if self.metrics_url is None:
            return {}
        with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=5) as response:
            gauges = parse_gauges(response.read().decode())
        return {f"{name}{{model={model}}}": gauges[(name, model)] for name, model in ZERO_WHEN_IDLE
                if gauges.get((name, model), 0.0)}


def run_batch(harness: GatewayHarness, count: int, seed: int) -> None:
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(case=gateway_cases())
    def one(case: GatewayCase) -> None:
        harness.run(case, label=f"seed {seed} case {harness.report.cases.total() + 1}")

    one()


def fuzz(url: str, key: str, metrics_url: str | None, count: int, seed: int, alive=lambda: True) -> int:
    logging.getLogger("websockets").setLevel(logging.CRITICAL)  # the dropped connections' own noise
    began = time.monotonic()
    harness = GatewayHarness(url, key, metrics_url, alive)
    try:
        run_batch(harness, count, seed)
    finally:
        harness.finish()
    print_report(harness.report, seed, time.monotonic() - began)
    return 1 if harness.report.failures else 0


def gateway_command(triton_url: str, port: int, keys_file: Path) -> list[str]:
    """The gateway as the runner's oracle assumes it (the same settings as the CI fixture)."""
    defaults = [arg for name, value in SESSION_DEFAULTS.items() for arg in ("--session-default", f"{name}={value}")]
    return [sys.executable, "-m", "backends.gateway.cli", "--triton", triton_url, "--port", str(port),
            "--api-keys", str(keys_file), "--max-message-bytes", str(MAX_MESSAGE_BYTES), "--max-waiting", "4",
            *defaults]


def _own_stack(args: argparse.Namespace) -> int:
    import tempfile

    from backends.gateway.auth import key_line
    from backends.serving.profiles import get_profile
    from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess, free_port

    key = "fuzz-key-0123456789"
    profile = get_profile(args.profile).with_overrides({"max_sessions": "3", "idle_timeout_s": "20"})
    with ServerProcess(ServerOptions(profile=profile, extra_args=["--exit-timeout-secs=5"])) as server, \
            tempfile.TemporaryDirectory() as tmp:
        keys, port = Path(tmp) / "keys", free_port()
        keys.write_text(f"{key_line(key)}\n")
        with open(Path(tmp) / "gateway.log", "wb") as log:
            gateway = subprocess.Popen(gateway_command(server.grpc_url, port, keys), stdout=log,
                                       stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, env={**os.environ})
        try:
            _wait_ready(f"http://127.0.0.1:{port}/metrics", gateway)
            metrics = f"http://{server.options.address}:{server.metrics_port}"
            alive = lambda: server.process.poll() is None and gateway.poll() is None  # noqa: E731
            return fuzz(f"ws://127.0.0.1:{port}", key, metrics, args.cases, args.seed, alive)
        finally:
            gateway.terminate()
            gateway.wait(40)
            if gateway.returncode:
                print((Path(tmp) / "gateway.log").read_text()[-3000:])


def _wait_ready(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the gateway did not come up")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gateway-url", help="ws://host:port of a running gateway (default: start server and gateway)")
    parser.add_argument("--api-key", default="", help="a key the running gateway accepts")
    parser.add_argument("--metrics-url", help="http://host:port of the server's metrics (the leftover check)")
    parser.add_argument("--profile", default="cpu")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gateway_url:
        return fuzz(args.gateway_url, args.api_key, args.metrics_url, args.cases, args.seed)
    return _own_stack(args)


if __name__ == "__main__":
    sys.exit(main())
