"""The soak's record and its results page: one window per report line (the time series), the
totals, the server's health (deaths, restarts, stub restarts, segfaults), the neighbour's
cycles, TTFP drift and what the server still held at the end; written as <name>.json, <name>.md
and <name>.png (perf/soak_plot.py), the shape of the other pages in perf/results.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perf.soak_plot import plot_soak, stage_sum

MAX_TABLE_ROWS = 30  # the page samples the series; the JSON keeps every window


@dataclass(frozen=True, slots=True)
class Window:
    """One report window; counts are totals since the start."""

    t_s: float
    sessions: int
    turns: int
    barge_ins: int
    drops: int
    errors: int
    ttfp_p50_ms: float | None  # server TTFPs that arrived in this window
    ttfp_p90_ms: float | None
    rss_mib: float | None  # the tritonserver process tree (server and its stubs)
    stubs: int | None
    stub_restarts: int
    server_pid: int | None
    neighbour_ran: bool  # the neighbour server ran (starting, up or stopping) during the window
    held: dict[str, float] = field(default_factory=dict)  # resource gauges, "name.model"


@dataclass(frozen=True, slots=True)
class Drift:
    """Server TTFP p50 of the first and last window that had one, and the fitted slope."""

    first_ms: float
    last_ms: float
    slope_ms_per_min: float
    windows: int
    basis: str  # which windows: a neighbour's start loads the shared cores for a while

    @property
    def pct(self) -> float:
        return 100.0 * (self.last_ms - self.first_ms) / self.first_ms


ALL_WINDOWS = "all windows"
QUIET_WINDOWS = "windows without the neighbour server"


def ttfp_drift(windows: list[Window]) -> Drift | None:
    """Over the windows in which no neighbour server ran, when there are two with a TTFP;
    over all windows otherwise."""
    timed = [w for w in windows if w.ttfp_p50_ms is not None]
    quiet = [w for w in timed if not w.neighbour_ran]
    basis = QUIET_WINDOWS if len(quiet) >= 2 and len(quiet) < len(timed) else ALL_WINDOWS
    points = [(w.t_s / 60.0, float(w.ttfp_p50_ms)) for w in (quiet if basis == QUIET_WINDOWS else timed)]
    if len(points) < 2 or points[0][1] <= 0:
        return None
    n = len(points)
    mean_t, mean_y = sum(t for t, _ in points) / n, sum(y for _, y in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    slope = sum((t - mean_t) * (y - mean_y) for t, y in points) / spread if spread else 0.0
    return Drift(points[0][1], points[-1][1], slope, n, basis)


@dataclass(frozen=True, slots=True)
class ServerHealth:
    watched: bool  # the soak started the server through the launcher and read its output
    restart_reasons: tuple[str, ...] = ()  # one per death (or hang) the supervisor acted on
    ready_again: int = 0  # restarts that brought the server back
    failed_restarts: int = 0
    given_up: bool = False
    launcher_exit: int | None = None  # the launcher ended before the soak did
    stub_restarts: int = 0
    segfaults: tuple[str, ...] = ()
    kernel_log_read: bool = False

    @property
    def deaths(self) -> int:
        return len(self.restart_reasons)

    def problems(self) -> list[str]:
        found = [f"{self.deaths} server deaths ({'; '.join(self.restart_reasons)})" if self.deaths else "",
                 f"{self.failed_restarts} failed restarts" if self.failed_restarts else "",
                 "the launcher gave up restarting" if self.given_up else "",
                 f"the launcher exited with {self.launcher_exit}" if self.launcher_exit is not None else "",
                 f"{self.stub_restarts} stub restarts" if self.stub_restarts else "",
                 f"{len(self.segfaults)} segfaults in the kernel log" if self.segfaults else ""]
        return [line for line in found if line]


@dataclass(slots=True)
class SoakResult:
    meta: dict[str, Any]  # command, commit, device, profile, workload, started, minutes
    windows: list[Window]
    sessions: int = 0
    turns: int = 0
    barge_ins: int = 0
    drops: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    server: ServerHealth = field(default_factory=lambda: ServerHealth(watched=False))
    neighbour: dict[str, Any] | None = None  # NeighbourTally.to_json(); None: no neighbour
    held_at_end: dict[str, float] = field(default_factory=dict)
    pauses: dict[str, Any] | None = None  # PauseTally.to_json(); None: no stub pauses

    def problems(self) -> list[str]:
        """Why the soak failed; empty when it passed (the exit status is 1 otherwise)."""
        found = [f"{sum(self.errors.values())} errors" if self.errors else "", *self.server.problems(),
                 f"neighbour failures: {len(self.neighbour['failures'])}" if self.neighbour and
                 self.neighbour["failures"] else "",
                 f"held at the end: {held_text(self.held_at_end)}" if self.held_at_end else "",
                 f"stub pause failures: {len(self.pauses['failures'])}" if self.pauses and
                 self.pauses["failures"] else ""]
        return [line for line in found if line]

    def to_json(self) -> dict[str, Any]:
        drift = ttfp_drift(self.windows)
        return {**self.meta, "sessions": self.sessions, "turns": self.turns, "barge_ins": self.barge_ins,
                "drops": self.drops, "errors": dict(self.errors),
                "server": {**asdict(self.server), "deaths": self.server.deaths},
                "neighbour": self.neighbour, "pauses": self.pauses, "held_at_end": dict(self.held_at_end),
                "ttfp_drift": None if drift is None else {**asdict(drift), "pct": drift.pct},
                "problems": self.problems(), "windows": [asdict(w) for w in self.windows]}


def held_text(held: dict[str, float]) -> str:
    return ", ".join(f"{key}={value:g}" for key, value in held.items())


def write_json(path: Path, result: SoakResult) -> None:
    """Also called after every window, so a soak cut short keeps its series."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")


def write_results(out_dir: Path, name: str, title: str, result: SoakResult) -> list[Path]:
    """<name>.json, .md and (with matplotlib) .png under `out_dir`; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{name}.json", out_dir / f"{name}.md"]
    write_json(written[0], result)
    plot = out_dir / f"{name}.png"
    has_plot = plot_soak(plot, title, result.meta, result.windows)
    written[1].write_text(render_markdown(title, result, plot.name if has_plot else None), encoding="utf-8")
    return [*written, plot] if has_plot else written


def render_markdown(title: str, result: SoakResult, plot_name: str | None) -> str:
    meta = result.meta
    lines = [f"# {title}", "", f"Current page of the soak. Re-run with `{meta['command']}`.", "",
             *[f"- {key}: {meta[key]}" for key in ("command", "commit", "device", "profile", "workload", "started")
               if meta.get(key)],
             f"- verdict: {'fail: ' + '; '.join(result.problems()) if result.problems() else 'pass'}",
             "", "## Summary", "", "| | |", "|---|---|", *_summary_rows(result), "",
             "## Over time", ""]
    if plot_name:
        lines += [f"Plot: [{plot_name}]({plot_name}) (server RSS and TTFP median per window).", ""]
    lines += [*_series_table(result.windows), "", "## Notes", "", *[f"- {note}" for note in _notes(result)], ""]
    return "\n".join(lines)


def _summary_rows(r: SoakResult) -> list[str]:
    s, last = r.server, r.windows[-1] if r.windows else None
    errors = ", ".join(f"{kind}: {n}" for kind, n in sorted(r.errors.items()))
    rows = [("duration", f"{(last.t_s if last else 0.0) / 60:.1f} min"),
            ("sessions admitted", r.sessions), ("turns", r.turns), ("barge-ins", r.barge_ins),
            ("client drops (no END, stream cancelled)", r.drops),
            ("errors", f"{sum(r.errors.values())}" + (f" ({errors})" if errors else "")),
            ("server deaths / restarts", _deaths(s)), ("stub restarts", _stubs(s)),
            ("neighbour cycles (failures)", _neighbour(r.neighbour)), *_pause_rows(r.pauses),
            ("TTFP p50, first / last window, drift", _drift(r)),
            ("server RSS start / end / max", _rss(r.windows)),
            ("GPU peak allocated (stages summed) first / last / max", _gpu(r.windows)),
            ("held at the end", held_text(r.held_at_end) or "nothing (every gauge back at its start value)")]
    return [f"| {name} | {value} |" for name, value in rows]


def _deaths(s: ServerHealth) -> str:
    if not s.watched:
        return "not watched (server started separately)"
    text = f"{s.deaths} / {s.ready_again}"
    extra = [f"failed restarts {s.failed_restarts}" if s.failed_restarts else "",
             "gave up" if s.given_up else "",
             f"launcher exited with {s.launcher_exit}" if s.launcher_exit is not None else "",
             "; ".join(s.restart_reasons)]
    extra = [e for e in extra if e]
    return text + (f" ({'; '.join(extra)})" if extra else "")


def _stubs(s: ServerHealth) -> str:
    kernel = (f"{len(s.segfaults)} segfault lines in the kernel log" if s.kernel_log_read
              else "kernel log not readable")
    return f"{s.stub_restarts} ({kernel})"


def _pause_rows(pauses: dict[str, Any] | None) -> list[tuple[str, str]]:
    if pauses is None:
        return []
    models = ", ".join(f"{model} {n}" for model, n in pauses["by_model"].items())
    return [("stub pauses, SIGSTOP then SIGCONT (failures)",
             f"{pauses['pauses']} ({len(pauses['failures'])})" + (f": {models}" if models else ""))]


def _neighbour(neighbour: dict[str, Any] | None) -> str:
    if neighbour is None:
        return "no neighbour"
    return f"{neighbour['cycles']} ({len(neighbour['failures'])})"


def _drift(r: SoakResult) -> str:
    drift = ttfp_drift(r.windows)
    if drift is None:
        return "fewer than two windows with a TTFP"
    return (f"{drift.first_ms:.0f} / {drift.last_ms:.0f} ms, drift {drift.pct:+.1f} % "
            f"(fitted slope {drift.slope_ms_per_min:+.2f} ms/min; {drift.basis}: {drift.windows})")


def _rss(windows: list[Window]) -> str:
    rss = [w.rss_mib for w in windows if w.rss_mib is not None]
    return _first_last_max(rss) if rss else "not measured"


GPU_PEAK = "cuda_peak_allocated_mib"  # each GPU stage's allocator peak since it became ready


def _gpu(windows: list[Window]) -> str:
    peaks = [mib for mib in (stage_sum(w, GPU_PEAK) for w in windows) if mib is not None]
    return _first_last_max(peaks) if peaks else "not published (no GPU stage)"


def _first_last_max(mib: list[float]) -> str:
    return f"{mib[0]:.0f} / {mib[-1]:.0f} / {max(mib):.0f} MiB (growth {mib[-1] - mib[0]:+.0f} MiB)"


def _series_table(windows: list[Window]) -> list[str]:
    step = max(1, -(-len(windows) // MAX_TABLE_ROWS))
    shown = windows[::step] + ([windows[-1]] if windows and (len(windows) - 1) % step else [])
    rows = ["| t (min) | sessions | turns | barge-ins | drops | errors | TTFP p50 / p90 (ms) | RSS (MiB) "
            "| GPU peak (MiB) | stubs | stub restarts | neighbour ran |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in shown:
        rows.append(f"| {w.t_s / 60:.1f} | {w.sessions} | {w.turns} | {w.barge_ins} | {w.drops} | {w.errors} "
                    f"| {_ms(w.ttfp_p50_ms)} / {_ms(w.ttfp_p90_ms)} | {_ms(w.rss_mib)} | {_ms(stage_sum(w, GPU_PEAK))} "
                    f"| {_ms(w.stubs)} "
                    f"| {w.stub_restarts} | {'yes' if w.neighbour_ran else 'no'} |")
    if step > 1:
        rows.append(f"\nEvery {step}th window of {len(windows)} (and the last); the JSON has them all.")
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _notes(r: SoakResult) -> list[str]:
    notes = ["TTFP is the server's `ttfp_ms` (acceptance of the unit that triggered the reply -> first "
             "audio); each window's p50 / p90 is over the replies whose first audio arrived in it. "
             "Drift = (last window p50 - first window p50) / first window p50.",
             "RSS is the resident memory of the tritonserver process and its descendants (the model "
             "stub processes); a restarted server starts a new tree. GPU peak: the stages' "
             "`minicpmo_cuda_peak_allocated_mib` summed (each stage's allocator peak since it became ready).",
             "A client drop closes the session's gRPC stream without END at a random moment of a "
             "random turn (the stream is cancelled, as when a client vanishes); the server reaps the "
             "session (client-gone detection, else the idle timeout), and 'held at the end' checks it did."]
    if r.neighbour is not None:
        notes.append("The neighbour server shares the machine's cores with the soaked server: windows in "
                     "which it ran (starting, up or stopping) show its load in TTFP, so the drift compares "
                     "windows without it where there are two.")
    return [*r.meta.get("notes", []), *notes]
