"""perf/bench_plot.py: the title names the run's device and profile, and vLLM-Omni's full-model
H200 numbers are drawn only beside runs of a full-model GPU profile."""
from __future__ import annotations

import pytest

from perf.bench_plot import build_figure, plot_title, profile_names, shows_reference

CPU = {"device": "CPU: Intel(R) Xeon(R) Processor (2 cores), Linux", "profile": "cpu"}
GPU = {"device": "NVIDIA H200, 143771 MiB", "profile": "gpu (server started separately)"}


def _level(concurrency: int) -> dict:
    stat = {"mean": 100.0 * concurrency, "median": 100.0, "p99": 120.0 * concurrency}
    return {"summary": {"concurrency": concurrency,
                        "metrics": {"ttfp_ms": stat, "client_ttfp_ms": stat,
                                    "rtf": {"mean": 0.6, "median": 0.6, "p99": 0.7}}}}


def test_profile_names_of_single_and_merged_runs():
    assert profile_names(GPU) == ["gpu"]
    assert profile_names({"profile": "gpu (server started separately) | gpu-split"}) == ["gpu", "gpu-split"]
    assert profile_names({}) == []


def test_reference_only_for_full_model_gpu_profiles():
    assert shows_reference(GPU)
    assert shows_reference({"profile": "gpu | gpu-split"})
    assert not shows_reference(CPU)
    assert not shows_reference({"profile": "gpu | cpu"})
    assert not shows_reference({})  # unknown profile: nothing to compare with


def test_title_names_device_and_profile():
    title = plot_title("Duplex realtime benchmark", GPU)
    assert title.splitlines() == ["Duplex realtime benchmark", "device: NVIDIA H200, 143771 MiB; profile: gpu"]
    assert plot_title("Bench", {}) == "Bench"


@pytest.mark.parametrize(("meta", "drawn"), [(CPU, False), (GPU, True)])
def test_reference_lines_follow_the_profile(meta, drawn):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = build_figure("Bench", [_level(1), _level(2)], meta)
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    plt.close(fig)
    assert any("vLLM-Omni" in label for label in labels) is drawn
    assert "ours, server TTFP mean" in labels
