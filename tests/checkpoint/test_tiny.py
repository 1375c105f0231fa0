"""Tests for backends/checkpoint/tiny.py.

Strategy: generate real tiny checkpoints into temporary directories (about 2 s each) and
compare them byte for byte; idempotence is checked through file identity (inode and mtime
unchanged), and every "replace or refuse" rule for an existing directory gets its own case.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import torch

from backends.checkpoint.loader import load_checkpoint
from backends.checkpoint.tiny import _publish, ensure_tiny_checkpoint, main


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _stamp(path: Path) -> tuple[int, int]:
    stat = (path / "config.json").stat()
    return stat.st_ino, stat.st_mtime_ns


def test_same_seed_gives_identical_bytes(tiny_dir: Path, tmp_path: Path) -> None:
    first = _files(tiny_dir)
    second = _files(ensure_tiny_checkpoint(tmp_path / "again", seed=0))
    assert sorted(first) == sorted(second)
    differing = [name for name in first if first[name] != second[name]]
    assert differing == []
    assert any(name.endswith(".safetensors") for name in first) and "config.json" in first


def test_layout_is_the_real_one(tiny_dir: Path) -> None:
    names = set(_files(tiny_dir))
    assert {"config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors.index.json", "assets/HT_ref_audio.wav",
            "assets/token2wav/flow.yaml", "assets/token2wav/flow.pt",
            "assets/token2wav/hift.pt"} <= names
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    raw = json.loads((tiny_dir / "config.json").read_text())
    assert (raw["version"], raw["architectures"], raw["model_type"]) == ("4.5", ["MiniCPMO"], "minicpmo")
    assert {"query_num", "image_size", "slice_config", "vision_config", "audio_config",
            "tts_config", "attention_bias", "_tiny"} <= set(raw)


def test_other_seed_changes_weights_not_layout(tiny_dir: Path, tmp_path: Path) -> None:
    other = _files(ensure_tiny_checkpoint(tmp_path / "seed1", seed=1))
    base = _files(tiny_dir)
    assert sorted(other) == sorted(base)
    assert other["tokenizer.json"] == base["tokenizer.json"]  # the tokenizer has no seed
    assert other["model-00001-of-00004.safetensors"] != base["model-00001-of-00004.safetensors"]


def test_second_call_reuses_the_directory(tiny_dir: Path) -> None:
    before = _stamp(tiny_dir)
    assert ensure_tiny_checkpoint(tiny_dir, seed=0) == tiny_dir
    assert _stamp(tiny_dir) == before


def test_stale_or_incomplete_tiny_dir_is_regenerated(tiny_copy: Path) -> None:
    (tiny_copy / "assets" / "HT_ref_audio.wav").unlink()
    ensure_tiny_checkpoint(tiny_copy, seed=0)
    assert (tiny_copy / "assets" / "HT_ref_audio.wav").is_file()
    ensure_tiny_checkpoint(tiny_copy, seed=2)
    assert json.loads((tiny_copy / "config.json").read_text())["_tiny"]["seed"] == 2
    leftovers = [p.name for p in tiny_copy.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no staging or stale directories survive


def test_foreign_directory_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a generated tiny checkpoint"):
        ensure_tiny_checkpoint(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        ensure_tiny_checkpoint(tmp_path / "file")


def test_empty_directory_is_filled(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert load_checkpoint(ensure_tiny_checkpoint(tmp_path / "empty")).is_tiny


def test_concurrent_callers_agree(tiny_dir: Path, tmp_path: Path) -> None:
    """Triton starts one process per stage and any of them may generate the same path at once;
    threads also share torch's global RNG, which once made the two copies differ."""
    target = tmp_path / "shared"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            ensure_tiny_checkpoint(target, seed=0)
        except Exception as err:  # collected for the assertion in the main thread
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _files(target) == _files(tiny_dir)


def test_late_publisher_keeps_the_published_copy(tiny_copy: Path, tmp_path: Path) -> None:
    """Another process may publish between our check and our rename; replacing its directory
    would pull files from under a stage that is already reading them."""
    staging = Path(shutil.copytree(tiny_copy, tmp_path / "staging"))
    before = _stamp(tiny_copy)
    _publish(staging, tiny_copy, seed=0)
    assert _stamp(tiny_copy) == before


def test_global_rng_is_untouched(tmp_path: Path) -> None:
    before = torch.random.get_rng_state()
    ensure_tiny_checkpoint(tmp_path / "rng", seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_cli_writes_and_prints_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path / "cli"), "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["_tiny"]["seed"] == 3
