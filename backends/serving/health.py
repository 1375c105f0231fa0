"""Readiness of the stages: a `health` action, the `health` model, and the probe.

Triton 2.51 reports a model READY as long as it is loaded: a stage whose engine thread died,
or whose stub process was killed, still shows READY on /v2/health/ready while every request
to it fails (verified: a killed stub answers "Stub process ... is not healthy" forever, and
2.51 has no model `is_ready` hook). So readiness is checked end to end:

- each stage answers a request with ACTION `health` at once: an empty FINAL while its engine
  thread runs, UNAVAILABLE when it does not (backends/serving/triton_stage.py);
- the `health` model (model_repository/health, body in health_model.py) sends that action to every stage over BLS and
  answers with a JSON report, or with UNAVAILABLE (HTTP 503-style failure) naming the stages
  that cannot serve:
      curl -sf -X POST http://HOST:8000/v2/models/health/infer -d '{"inputs": []}'
- `python -m backends.serving.health --url http://HOST:8000` does the same and exits 0 (ready)
  or 1 (not ready); the launcher's readiness (`ServerProcess.is_ready`) uses it too.
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

ACTION_HEALTH = "health"
HEALTH_MODEL = "health"
STAGE_NAMES = ("thinker", "talker", "code2wav")
OK = "ok"
NOT_READY_PREFIX = "not ready: "


@dataclass(frozen=True, slots=True)
class HealthReport:
    stages: dict[str, str]  # stage -> "ok" or why it cannot serve

    @property
    def ready(self) -> bool:
        return bool(self.stages) and all(state == OK for state in self.stages.values())

    @property
    def down(self) -> list[str]:
        return sorted(stage for stage, state in self.stages.items() if state != OK)

    def to_json(self) -> str:
        return json.dumps({"ready": self.ready, "stages": self.stages}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "HealthReport":
        payload = json.loads(text)
        if not isinstance(payload, dict) or not isinstance(payload.get("stages"), dict):
            raise ValueError(f"not a health report: {text[:200]!r}")
        return HealthReport({str(k): str(v) for k, v in payload["stages"].items()})


def probe(http_url: str, timeout_s: float = 10.0) -> HealthReport:
    """Ask the `health` model over HTTP; raises OSError when the server cannot be reached."""
    request = urllib.request.Request(f"{http_url}/v2/models/{HEALTH_MODEL}/infer", data=b'{"inputs": []}',
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
        return HealthReport.from_json(body["outputs"][0]["data"][0])
    except urllib.error.HTTPError as exc:
        message = json.loads(exc.read() or b"{}").get("error", "")
        if NOT_READY_PREFIX in message:
            return HealthReport.from_json(message.split(NOT_READY_PREFIX, 1)[1])
        return HealthReport({HEALTH_MODEL: f"HTTP {exc.code}: {message}"})


def server_ready(http_url: str, check_stages: bool = True, timeout_s: float = 10.0) -> bool:
    """Triton's own readiness (every model loaded) and, with `check_stages`, every stage serving."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=timeout_s) as resp:
            if resp.status != 200:
                return False
        return probe(http_url, timeout_s).ready if check_stages else True
    except (OSError, ValueError, KeyError, IndexError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Exit 0 when every stage of the server can serve, else 1.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="Triton HTTP address")
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    try:
        report = probe(args.url.rstrip("/"), args.timeout)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        print(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(report.to_json())
    return 0 if report.ready else 1


if __name__ == "__main__":
    sys.exit(main())
