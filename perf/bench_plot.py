"""PNG plot of a duplex benchmark run: TTFP and RTF against concurrency.

The title names the device and the profile of the run (from its meta). vLLM-Omni's published
MiniCPM-o 4.5 numbers (full model, one H200) are drawn beside ours only for the full-model GPU
profiles: the tiny model on a CPU is not comparable with them.

matplotlib is the `plot` extra (`pip install -e .[plot]`); without it the plot is skipped
and the caller says so.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf.bench_report import REFERENCE, Level

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Profiles that serve MiniCPM-o 4.5 at its real dimensions (backends/serving/profiles.py).
FULL_MODEL_PROFILES = ("gpu", "gpu-split")


def profile_names(meta: Mapping[str, Any]) -> list[str]:
    """Profile names of a run: 'gpu (server started separately)' -> ['gpu']; merged parts
    join theirs with ' | '."""
    text = str(meta.get("profile", "")).strip()
    return [part.split()[0] for part in text.split(" | ") if part.strip()]


def shows_reference(meta: Mapping[str, Any]) -> bool:
    """Whether the run is comparable with the reference: every part on a full-model GPU profile."""
    names = profile_names(meta)
    return bool(names) and all(name in FULL_MODEL_PROFILES for name in names)


def plot_title(title: str, meta: Mapping[str, Any]) -> str:
    """The caller's title, then a line naming the device and the profile the run recorded."""
    facts = [f"device: {meta['device']}" if meta.get("device") else "",
             f"profile: {' | '.join(profile_names(meta))}" if profile_names(meta) else ""]
    line = "; ".join(fact for fact in facts if fact)
    return f"{title}\n{line}" if line else title


def plot_levels(path: Path, title: str, levels: Sequence[Level], meta: Mapping[str, Any] | None = None) -> bool:
    """Write the plot; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on servers and CI
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = build_figure(title, levels, meta or {})
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def build_figure(title: str, levels: Sequence[Level], meta: Mapping[str, Any]) -> "Figure":
    import matplotlib.pyplot as plt

    fig, (ttfp_ax, rtf_ax) = plt.subplots(1, 2, figsize=(11, 4.6))
    summaries = [level["summary"] for level in levels]
    reference = shows_reference(meta)
    _plot_ttfp(ttfp_ax, summaries, reference)
    _plot_rtf(rtf_ax, summaries, reference)
    fig.suptitle(plot_title(title, meta), fontsize=10)
    fig.tight_layout()
    return fig


def _series(summaries: Sequence[dict[str, Any]], metric: str, stat: str) -> tuple[list[int], list[float]]:
    points = [(s["concurrency"], s["metrics"][metric][stat]) for s in summaries]
    kept = [(c, v) for c, v in points if v is not None]
    return [c for c, _ in kept], [v for _, v in kept]


def _reference(column: int, which: int) -> tuple[list[int], list[float]]:
    levels = sorted(REFERENCE)
    return levels, [REFERENCE[c][column][which] for c in levels]


def _plot_ttfp(ax: "Axes", summaries: Sequence[dict[str, Any]], reference: bool) -> None:
    for stat, style in (("mean", "o-"), ("p99", "s--")):
        ax.plot(*_series(summaries, "ttfp_ms", stat), style, label=f"ours, server TTFP {stat}")
    ax.plot(*_series(summaries, "client_ttfp_ms", "mean"), "^:", label="ours, client TTFP mean")
    if reference:
        ax.plot(*_reference(0, 1), "x-", color="grey", label="vLLM-Omni MRv2, mean")
        ax.plot(*_reference(1, 1), "x--", color="grey", label="vLLM-Omni MRv2, P99")
    _axes(ax, "TTFP (ms)")


def _plot_rtf(ax: "Axes", summaries: Sequence[dict[str, Any]], reference: bool) -> None:
    for stat, style in (("median", "o-"), ("p99", "s--")):
        ax.plot(*_series(summaries, "rtf", stat), style, label=f"ours, RTF {stat}")
    if reference:
        ax.plot(*_reference(2, 1), "x-", color="grey", label="vLLM-Omni MRv2, median")
        ax.plot(*_reference(3, 1), "x--", color="grey", label="vLLM-Omni MRv2, P99")
    ax.axhline(1.0, color="red", linewidth=0.8, label="real time")
    _axes(ax, "RTF")


def _axes(ax: "Axes", ylabel: str) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 1 2 4 8, not 2^0 2^1
    ax.set_xlabel("concurrent sessions C")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
