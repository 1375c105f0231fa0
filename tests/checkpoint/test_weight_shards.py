"""Tests for backends/checkpoint/weight_shards.py.

Strategy: write small known tensors with a shard limit that forces several shards, then
check the HF index layout, the packing limit, and that lazy prefix loads return exactly
what was written; broken indexes must be refused with the file named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from backends.checkpoint.weight_shards import INDEX_FILE, SINGLE_FILE, WeightIndex, write_shards

FLOAT32_BYTES = 4


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "llm.a.weight": torch.randn(8, 8, generator=g),  # 256 bytes
        "llm.b.weight": torch.randn(8, 8, generator=g),
        "tts.big.weight": torch.randn(40, 8, generator=g),  # 1280 bytes, over the limit alone
        "tts.c.bias": torch.randn(8, generator=g),
    }


def test_shards_respect_the_limit_and_index_lists_every_tensor(tmp_path: Path) -> None:
    tensors = _tensors()
    names = write_shards(tensors, tmp_path, max_shard_bytes=600)
    assert names == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() for t in tensors.values()) * FLOAT32_BYTES
    assert index["weight_map"] == {
        "llm.a.weight": names[0], "llm.b.weight": names[0],
        "tts.big.weight": names[1], "tts.c.bias": names[2],
    }


def test_prefix_load_strips_prefix_and_spans_shards(tmp_path: Path) -> None:
    tensors = _tensors()
    write_shards(tensors, tmp_path, max_shard_bytes=600)
    index = WeightIndex.from_dir(tmp_path)
    tts = index.load("tts.")
    assert sorted(tts) == ["big.weight", "c.bias"]
    assert torch.equal(tts["big.weight"], tensors["tts.big.weight"])
    assert index.load("vpm.") == {}
    assert index.has_prefix("llm.") and not index.has_prefix("llm.z")


def test_single_file_layout_is_read(tmp_path: Path) -> None:
    save_file(_tensors(), str(tmp_path / SINGLE_FILE))
    assert WeightIndex.from_dir(tmp_path).names() == sorted(_tensors())


def test_missing_shard_is_named(tmp_path: Path) -> None:
    names = write_shards(_tensors(), tmp_path, max_shard_bytes=600)
    (tmp_path / names[1]).unlink()
    with pytest.raises(ValueError, match=f"missing weight shards .*{names[1]}"):
        WeightIndex.from_dir(tmp_path)


@pytest.mark.parametrize("content", ["{not json", "[]", '{"metadata": {}}'])
def test_broken_index_is_refused(tmp_path: Path, content: str) -> None:
    (tmp_path / INDEX_FILE).write_text(content)
    with pytest.raises(ValueError, match="not a safetensors index"):
        WeightIndex.from_dir(tmp_path)


def test_no_weights_at_all_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing weights"):
        WeightIndex.from_dir(tmp_path)
