"""PNG plot of a soak: the server's memory and its TTFP median over time, side by side.

The title names the device and the profile (perf/bench_plot.py's convention); windows while
the neighbour server ran are shaded. matplotlib is the `plot` extra: without it the plot is
skipped and the caller says so.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf.bench_plot import plot_title

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from perf.soak_report import Window


def plot_soak(path: Path, title: str, meta: Mapping[str, Any], windows: Sequence["Window"]) -> bool:
    """Write the plot; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on servers and CI
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = build_figure(title, meta, windows)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def build_figure(title: str, meta: Mapping[str, Any], windows: Sequence["Window"]) -> "Figure":
    import matplotlib.pyplot as plt

    fig, (rss_ax, ttfp_ax) = plt.subplots(1, 2, figsize=(11, 4.6))
    minutes = [w.t_s / 60.0 for w in windows]
    _series(rss_ax, minutes, [w.rss_mib for w in windows], "o-", "server RSS (process tree)")
    for gauge, style, label in (("cuda_peak_allocated_mib", "^-", "GPU peak allocated (stages, summed)"),
                                ("cuda_reserved_mib", "v--", "GPU reserved (stages, summed)")):
        values = [stage_sum(w, gauge) for w in windows]
        if any(value is not None for value in values):  # GPU stages only
            _series(rss_ax, minutes, values, style, label)
    for stat, style in (("p50", "o-"), ("p90", "s--")):
        _series(ttfp_ax, minutes, [getattr(w, f"ttfp_{stat}_ms") for w in windows], style, f"server TTFP {stat}")
    for ax, ylabel in ((rss_ax, "memory (MiB)"), (ttfp_ax, "TTFP per window (ms)")):
        _shade_neighbour(ax, minutes, windows)
        _axes(ax, ylabel)
    fig.suptitle(plot_title(title, meta), fontsize=10)
    fig.tight_layout()
    return fig


def _series(ax: "Axes", minutes: Sequence[float], values: Sequence[float | None], style: str, label: str) -> None:
    """One line over the windows that have a value."""
    kept = [(t, value) for t, value in zip(minutes, values) if value is not None]
    ax.plot([t for t, _ in kept], [value for _, value in kept], style, markersize=3, label=label)


def stage_sum(window: "Window", gauge: str) -> float | None:
    """A gauge summed over the stages that publish it (the GPU ones), None when none does."""
    values = [value for key, value in window.held.items() if key.startswith(gauge + ".")]
    return sum(values) if values else None


def _shade_neighbour(ax: "Axes", minutes: Sequence[float], windows: Sequence["Window"]) -> None:
    """Shade each window (the span up to its report) in which the neighbour server ran."""
    labelled = False
    for start, end, window in zip([0.0, *minutes], minutes, windows):
        if window.neighbour_ran:
            ax.axvspan(start, end, color="grey", alpha=0.15, linewidth=0,
                       label=None if labelled else "neighbour server ran")
            labelled = True


def _axes(ax: "Axes", ylabel: str) -> None:
    ax.set_xlabel("time (min)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
