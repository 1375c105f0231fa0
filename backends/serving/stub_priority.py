"""Per-stage MPS client settings through a wrapper stub: below-normal priority (opt-in:
`MINICPMO_MPS_LOW_PRIORITY`) and a cap on the SMs a stage's kernels may occupy (opt-in:
`MINICPMO_MPS_SM_PERCENT`, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE).

MPS takes a client's priority from the environment the client process starts with
(`CUDA_MPS_CLIENT_PRIORITY`: 0 normal, 1 below normal), and a Python-backend stub connects to
MPS when Triton starts it, before the model's `initialize` runs; every stub inherits
tritonserver's one environment. Setting the variable in `initialize` therefore came too late
(H200 runs, perf/results/duplex_h200.md, ninth session). Triton runs a model directory's own
`triton_python_backend_stub` when there is one, so the launcher writes one there for each
listed stage: a shell script that sets the variable and execs the real stub with the same
arguments (with none, the real stub's usage exit, which Triton's startup probe expects).
Without an MPS server the driver ignores the variable.

Measured on one H200 (perf/results/duplex_h200.md, tenth session: two server starts each, in
the order none / code2wav / code2wav / none): Code2Wav below normal gave server TTFP 156 / 151
ms at 16 sessions against 170 / 182 without, and 216 / 198 ms against 254 / 247 at 32: the
vocoder's windows (deadlines ~1 s away) yield to the Thinker's and the Talker's kernels, which
hold a reply's first audio. So Code2Wav started below normal by default from then on. Two
later full runs with that default (runs 14 and 15: 140 / 132 ms at 16, 209 / 185 ms at 32)
gained little against the full runs before it (142-149, 181-219).

Since the decode kernels launch with programmatic dependent launch (fourteenth session: Thinker
and Talker steps 15-30% shorter under load), Code2Wav's first window is the largest part of a
reply's audio tail at 16 sessions, and the balance turned: in two paired starts (runs 22 and 23,
each below normal then normal) normal priority gave 111 / 113 ms at 16 sessions against 117 /
124, and 146 / 147 ms at 32 against 153 / 161 (P99 137 / 143 against 170 / 172, and 185 / 179
against 203 / 217). So no stage is lowered by default now (`DEFAULT_LOW_PRIORITY` is empty);
naming stages in the option or the environment still does it.

The SM cap is a diagnostic: Code2Wav capped at 50% or 35% of the SMs left the Thinker's step at
16 sessions where it was (7.4-7.7 ms) and only slowed Code2Wav's own forwards (H200,
perf/results/duplex_h200.md, twenty-fourth session).
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

from backends.serving.profiles import STAGES

LOW_PRIORITY_ENV = "MINICPMO_MPS_LOW_PRIORITY"  # comma-separated stage names, or "none"
SM_PERCENT_ENV = "MINICPMO_MPS_SM_PERCENT"  # "stage=percent,...": a cap on a stage's share of the SMs
DEFAULT_LOW_PRIORITY: tuple[str, ...] = ()  # under an MPS daemon, when neither option nor env says
STUB_NAME = "triton_python_backend_stub"


def low_priority_stages(value: str) -> tuple[str, ...]:
    """'code2wav, talker' -> ('code2wav', 'talker'), 'none' -> (); ValueError on a name that
    is no stage."""
    if value.strip().lower() == "none":
        return ()
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in STAGES]
    if unknown:
        raise ValueError(f"{LOW_PRIORITY_ENV}: {', '.join(unknown)} is not a stage (one of {', '.join(STAGES)})")
    return names


def stages_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[str, ...] | None:
    """The stages the environment names; None when it names none (the launcher's default)."""
    value = environ.get(LOW_PRIORITY_ENV)
    return None if value is None or not value.strip() else low_priority_stages(value)


def sm_percents(value: str) -> dict[str, int]:
    """'code2wav=50, talker=80' -> {'code2wav': 50, 'talker': 80}: the percentage of the SMs a
    stage's kernels may occupy under MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); ValueError on a
    name that is no stage or a percentage outside 1-100."""
    caps: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        stage, _, percent = item.partition("=")
        stage = stage.strip()
        if stage not in STAGES:
            raise ValueError(f"{SM_PERCENT_ENV}: {stage!r} is not a stage (one of {', '.join(STAGES)})")
        if not percent.strip().isdecimal() or not 1 <= int(percent) <= 100:
            raise ValueError(f"{SM_PERCENT_ENV}: {item!r} needs a whole percentage in 1-100")
        caps[stage] = int(percent)
    return caps


def stage_environments(low_priority: Iterable[str], caps: Mapping[str, int]) -> dict[str, dict[str, str]]:
    """The MPS client variables each stage's stub starts with (stages without any are left out)."""
    envs: dict[str, dict[str, str]] = {stage: {"CUDA_MPS_CLIENT_PRIORITY": "1"} for stage in low_priority}
    for stage, percent in caps.items():
        envs.setdefault(stage, {})["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
    return envs


def wrapper_text(real_stub: Path, env: Mapping[str, str]) -> str:
    settings = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return ("#!/bin/sh\n"
            "# Written by the launcher (backends/serving/stub_priority.py): this model's stub process\n"
            "# starts with these MPS client settings.\n"
            f"{settings} exec {shlex.quote(str(real_stub))} \"$@\"\n")


def install_wrappers(repository: Path, stage_envs: Mapping[str, Mapping[str, str]], real_stub: Path) -> list[Path]:
    """Write the wrapper stub into each listed stage's model directory of a rendered repository
    (`stage_envs`: stage -> the variables its stub starts with); returns the files written."""
    names = tuple(stage_envs)
    if names and not real_stub.is_file():
        raise ValueError(f"no Python backend stub at {real_stub} for the stages' wrappers")
    written = []
    for stage in names:
        model_dir = repository / stage
        if not model_dir.is_dir():
            raise ValueError(f"no model directory {model_dir} for stage {stage!r}")
        path = model_dir / STUB_NAME
        path.write_text(wrapper_text(real_stub, stage_envs[stage]))
        path.chmod(0o755)
        written.append(path)
    return written
