"""The HF safetensors weight layout: one `model.safetensors`, or shards plus an index.

The index (`model.safetensors.index.json`) maps every tensor name to its shard file. Reading
is lazy: only the shards holding the requested names are opened, and only those tensors
are materialised.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FILE_METADATA = {"format": "pt"}  # what HF writers put in every safetensors header


def write_shards(tensors: Mapping[str, torch.Tensor], out_dir: Path,
                 max_shard_bytes: int) -> list[str]:
    """Write `tensors` as HF-named shards of at most `max_shard_bytes` (a larger single
    tensor gets a shard of its own) plus the index; return the shard file names."""
    groups = _pack(tensors, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map: dict[str, str] = {}
    for name, keys in zip(names, groups):
        save_file({k: tensors[k].contiguous() for k in keys}, str(out_dir / name), _FILE_METADATA)
        weight_map.update((k, name) for k in keys)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return names


def _pack(tensors: Mapping[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    # Greedy in insertion order keeps each component's tensors together, as HF's splitter does.
    groups: list[list[str]] = [[]]
    size = 0
    for key, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += nbytes
    return [g for g in groups if g]


@dataclass(frozen=True, slots=True)
class WeightIndex:
    """Where every tensor of a checkpoint directory lives."""

    files_by_name: Mapping[str, Path]  # tensor name -> safetensors file holding it

    @classmethod
    def from_dir(cls, path: Path) -> WeightIndex:
        """Read the index (or the single file's header); ValueError if weights are missing."""
        path = Path(path)
        if (path / INDEX_FILE).is_file():
            return cls(_read_index(path))
        if (path / SINGLE_FILE).is_file():
            with safe_open(str(path / SINGLE_FILE), framework="pt") as f:
                return cls({k: path / SINGLE_FILE for k in f.keys()})
        raise ValueError(f"missing weights: neither {INDEX_FILE} nor {SINGLE_FILE} in {path}")

    def names(self) -> list[str]:
        return sorted(self.files_by_name)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The stored shape of tensor `name` (read from its file's header), None if absent."""
        file = self.files_by_name.get(name)
        if file is None:
            return None
        with safe_open(str(file), framework="pt") as f:
            return tuple(f.get_slice(name).get_shape())

    def has_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.files_by_name)

    def load(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors whose name starts with `prefix`, keyed by the name with `prefix` removed."""
        by_file: dict[Path, list[str]] = defaultdict(list)
        for name, file in self.files_by_name.items():
            if name.startswith(prefix):
                by_file[file].append(name)
        out: dict[str, torch.Tensor] = {}
        for file, names in sorted(by_file.items()):
            with safe_open(str(file), framework="pt") as f:
                out.update((n[len(prefix):], f.get_tensor(n)) for n in names)
        return out


def _read_index(path: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads((path / INDEX_FILE).read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path / INDEX_FILE}: not a safetensors index ({err!r})") from err
    missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
    if missing:
        raise ValueError(f"missing weight shards listed in {INDEX_FILE}: {', '.join(missing)}")
    return {name: path / file for name, file in weight_map.items()}
