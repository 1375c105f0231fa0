"""The graphed chunk pass (backends/audio/encoder_graphs.py) against the plain streaming encode.

Twin sessions over one small tower: one twin encodes unit by unit without graphs, the other
with the shared `ChunkEncoderGraphs` (on the CPU its static-buffer pass runs eagerly: the very
work a CUDA graph records; on CUDA it is captured and replayed). Sessions start at different
stream ages so batches mix first units, restarts (a position table of 200 restarts the cache
every 3 units) and long caches; groups beyond `max_rows` split. Rows and caches must equal
the plain twin's.
"""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from backends.audio import batched_encoder, encoder_graphs
from backends.audio.batched_encoder import encode_units_batched
from backends.audio.encoder_graphs import ChunkEncoderGraphs, key_buckets
from backends.audio.encoder_model import AudioEncoderModel
from backends.audio.streaming_encoder import StreamingAudioConfig, StreamingAudioEncoder
from backends.models.whisper_encoder import WhisperEncoderConfig
from encoder_twins import assert_same_cache, make_twins

SMALL_TABLE = WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                   encoder_ffn_dim=256, num_mel_bins=80, max_source_positions=200)
RTOL, ATOL = 1e-5, 1e-5  # masked full-table attention sums in another order
FRAMES = StreamingAudioConfig().frames_per_unit
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
NEEDS_TRITON = pytest.mark.skipif(find_spec("triton") is None, reason="needs triton")


def _model(device: str) -> AudioEncoderModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return AudioEncoderModel.from_config(SMALL_TABLE, 48, device=device)


def _twins(model: AudioEncoderModel, graphs: ChunkEncoderGraphs, ages: list[int], steps: int):
    def make() -> tuple[StreamingAudioEncoder, StreamingAudioEncoder]:
        plain, graphed = StreamingAudioEncoder(model), StreamingAudioEncoder(model, graphs=graphs)
        assert graphed.graphs is graphs and plain.graphs is None
        return plain, graphed

    return make_twins(make, ages, steps, seed=50)


def _assert_same(got: StreamingAudioEncoder, want: StreamingAudioEncoder) -> None:
    assert_same_cache(got, want, RTOL, ATOL)


@pytest.mark.parametrize("packed", [False, True])  # q, k, v as one GEMM: as served
@pytest.mark.parametrize("device", DEVICES)
def test_graphed_unit_by_unit_equals_plain(device: str, packed: bool) -> None:
    model = _model(device)
    model.apm.pack_projections(packed)
    graphs = ChunkEncoderGraphs(model, FRAMES, max_rows=2)
    for plain, graphed, audio in _twins(model, graphs, [0, 2], steps=5):
        for unit in audio:
            torch.testing.assert_close(graphed.encode_unit(unit), plain.encode_unit(unit),
                                       rtol=RTOL, atol=ATOL)
            _assert_same(graphed, plain)


@pytest.mark.parametrize("device", DEVICES)
def test_graphed_batches_split_into_groups_and_equal_plain(device: str, monkeypatch) -> None:
    model = _model(device)
    graphs = ChunkEncoderGraphs(model, FRAMES, max_rows=2)
    sizes = []
    real = batched_encoder._forward_batch
    monkeypatch.setattr(batched_encoder, "_forward_batch",
                        lambda group: (sizes.append(len(group)), real(group))[1])
    _assert_batched_equal_plain(_twins(model, graphs, [0, 1, 3, 4, 8], steps=4), steps=4)
    assert sizes == [2, 2] * 4  # the fifth session of each step: a group of one, serial path


def _assert_batched_equal_plain(twins, steps: int) -> None:
    for step in range(steps):
        want = [plain.encode_unit(audio[step]) for plain, _, audio in twins]
        got = encode_units_batched([g for _, g, _ in twins], [a[step] for _, _, a in twins])
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor)
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
        for plain, graphed, _ in twins:
            _assert_same(graphed, plain)


@NEEDS_TRITON
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Triton's interpreter on numpy 1.26
@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.interpreter), *DEVICES[1:]])
def test_split_key_passes_equal_plain(device: str) -> None:
    """The attention through the split-key kernel (interpreted on the CPU): two rows of one
    pass ending at different frames, then the older one's restart at the table."""
    model = _model(device)
    graphs = ChunkEncoderGraphs(model, FRAMES, max_rows=2, split_keys=True)
    _assert_batched_equal_plain(_twins(model, graphs, [0, 2], steps=2), steps=2)


def test_key_buckets_are_powers_of_two_from_64_then_the_table() -> None:
    assert key_buckets(1500) == (64, 128, 256, 512, 1024, 1500)
    assert key_buckets(1024) == (64, 128, 256, 512, 1024)
    assert key_buckets(50) == (50,)


@pytest.mark.parametrize("device", DEVICES)
def test_a_pass_attends_over_the_smallest_key_bucket_holding_its_rows(device: str,
                                                                      monkeypatch) -> None:
    model = _model(device)
    graphs = ChunkEncoderGraphs(model, FRAMES, max_rows=2)
    assert graphs.key_sizes == (64, 128, 200)
    if device == "cuda":
        assert graphs.capture_all() == len(graphs.sizes) * len(graphs.key_sizes)
    shapes, real = [], ChunkEncoderGraphs._run
    monkeypatch.setattr(ChunkEncoderGraphs, "_run",
                        lambda self, shape, buffers: (shapes.append(shape),
                                                      real(self, shape, buffers))[1])
    for plain, graphed, audio in _twins(model, graphs, [0], steps=4):
        for unit in audio:
            torch.testing.assert_close(graphed.encode_unit(unit), plain.encode_unit(unit),
                                       rtol=RTOL, atol=ATOL)
    # rows ending at 50, 100 and 150 frames, then the cache's restart at the table: 50 again
    assert shapes == [(1, 64), (1, 128), (1, 200), (1, 64)]
    with pytest.raises(ValueError, match="exceeds the key table 200"):
        graphs._key_bucket(201)
    if device == "cuda":  # every shape was captured at `capture_all`, none since
        assert len(graphs._graphs) == len(graphs.sizes) * len(graphs.key_sizes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captures_warm_up_on_one_stream(monkeypatch) -> None:
    # The allocator caches blocks per stream: a warm-up stream per capture held every
    # warm-up's memory apart (18 graphs: ~6.7 GB at the real sizes). What torch does inside a
    # capture is its own business (counting torch.cuda.Stream creations failed on torch 2.11):
    # the warm-up stream our captures are handed is what must be one.
    sides = []
    real = encoder_graphs.capture_graph
    monkeypatch.setattr(encoder_graphs, "capture_graph",
                        lambda run, pool, steps, side=None: (sides.append(side),
                                                             real(run, pool, steps, side))[1])
    graphs = ChunkEncoderGraphs(_model("cuda"), FRAMES, max_rows=2)
    assert graphs.capture_all() == 6
    assert len(sides) == 6 and sides[0] is not None and all(side is sides[0] for side in sides)


@pytest.mark.parametrize("device", DEVICES)
def test_passes_attend_through_the_split_key_kernel_on_cuda_only(device: str) -> None:
    assert ChunkEncoderGraphs(_model(device), FRAMES).split_keys == (device == "cuda")


def test_capture_all_without_cuda_captures_nothing() -> None:
    assert ChunkEncoderGraphs(_model("cpu"), FRAMES).capture_all() == 0


def test_a_failing_group_falls_back_without_committing_twice(monkeypatch) -> None:
    model = _model("cpu")
    graphs = ChunkEncoderGraphs(model, FRAMES, max_rows=2)
    twins = _twins(model, graphs, [1, 2, 5, 6], steps=1)
    real, calls = ChunkEncoderGraphs._run, []

    def second_group_fails(self, shape, buffers):
        calls.append(shape)
        if len(calls) == 2:
            raise RuntimeError("injected replay failure")
        return real(self, shape, buffers)

    monkeypatch.setattr(ChunkEncoderGraphs, "_run", second_group_fails)
    want = [plain.encode_unit(audio[0]) for plain, _, audio in twins]
    got = encode_units_batched([g for _, g, _ in twins], [a[0] for _, _, a in twins])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
    for plain, graphed, _ in twins:
        _assert_same(graphed, plain)


def test_graphs_of_another_chunk_length_are_not_used() -> None:
    model = _model("cpu")
    assert StreamingAudioEncoder(model, graphs=ChunkEncoderGraphs(model, FRAMES + 1)).graphs is None
    other = _model("cpu")
    assert StreamingAudioEncoder(model, graphs=ChunkEncoderGraphs(other, FRAMES)).graphs is None
    with pytest.raises(ValueError, match="1 to 2 rows"):
        ChunkEncoderGraphs(model, FRAMES, max_rows=2)._bucket(3)
