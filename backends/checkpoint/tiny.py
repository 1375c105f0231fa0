"""Generate the tiny default checkpoint (real MiniCPM-o 4.5 layout, tiny widths, random weights).

Generation is a pure function of the seed: the same seed gives the same bytes for config,
tokenizer, weights, reference voice and token2wav assets. It is written into a temporary sibling directory and renamed into
place, so a directory at `path` is either absent or complete; several processes (one per
Triton stage) may call `ensure_tiny_checkpoint` on the same path at once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

from backends.checkpoint.config import CONFIG_FILE, MiniCPMOConfig
from backends.checkpoint.loader import REFERENCE_VOICE_FILE, TOKEN2WAV_DIR
from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
from backends.checkpoint.tiny_config import TINY_MARKER_KEY, tiny_config_dict, tiny_marker
from backends.checkpoint.tiny_tokenizer import (
    AUDIO_BOS_TOKEN, EOS_TOKEN, TEXT_EOS_TOKEN, tiny_tokenizer_config, train_tiny_tokenizer,
)
from backends.checkpoint.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from backends.checkpoint.wav_file import write_wav_pcm16
from backends.checkpoint.weight_shards import INDEX_FILE, write_shards

MAX_SHARD_BYTES = 2 * 1024 * 1024  # ~5.5 MB of tiny weights -> a few shards, like the real layout
# Seeded initialisation goes through torch's process-wide RNG (transformers' and token2wav's
# init take no generator), so two threads generating at once would interleave draws. The lock
# owns that RNG during generation and lets a second in-process caller reuse the first's
# result; separate processes are handled by the atomic rename instead.
_GENERATION_LOCK = threading.Lock()
_REQUIRED_FILES = (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, INDEX_FILE,
                   REFERENCE_VOICE_FILE, f"{TOKEN2WAV_DIR}/flow.yaml", f"{TOKEN2WAV_DIR}/flow.pt",
                   f"{TOKEN2WAV_DIR}/hift.pt")


def ensure_tiny_checkpoint(path: Path, seed: int = 0) -> Path:
    """Return `path`, generating the tiny checkpoint there unless a matching one exists.

    A directory holding a tiny checkpoint of another seed or format is replaced; a non-empty
    directory that is not a tiny checkpoint is never touched (ValueError).
    """
    path = Path(path)
    with _GENERATION_LOCK:
        return _ensure(path, seed)


def _ensure(path: Path, seed: int) -> Path:
    if _is_current(path, seed):
        return path
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a directory")
    if path.exists() and _read_marker(path) is None and any(path.iterdir()):
        raise ValueError(f"{path} exists and is not a generated tiny checkpoint; refusing to "
                         f"overwrite it (choose another directory)")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.staging.", dir=path.parent))
    staging.chmod(0o755)  # mkdtemp makes 0700; the published directory should be readable
    try:
        write_tiny_checkpoint(staging, seed)
        _publish(staging, path, seed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def write_tiny_checkpoint(out_dir: Path, seed: int) -> None:
    """Write every file of the tiny checkpoint into the existing directory `out_dir`."""
    tokenizer = train_tiny_tokenizer()
    tokenizer.save(str(out_dir / TOKENIZER_FILE), pretty=True)
    _write_json(out_dir / TOKENIZER_CONFIG_FILE, tiny_tokenizer_config(tokenizer))
    raw = tiny_config_dict(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        audio_bos_token_id=tokenizer.token_to_id(AUDIO_BOS_TOKEN),
        text_eos_token_id=tokenizer.token_to_id(TEXT_EOS_TOKEN),
        eos_token_id=tokenizer.token_to_id(EOS_TOKEN),
        seed=seed,
    )
    config = MiniCPMOConfig.from_dict(raw)  # the generator's own output must validate
    _write_json(out_dir / CONFIG_FILE, raw)
    # Imported here: transformers takes seconds to import and only generation needs it.
    from backends.checkpoint.tiny_weights import tiny_state_dict

    write_shards(tiny_state_dict(config, seed), out_dir, MAX_SHARD_BYTES)
    write_tiny_assets(out_dir, seed)


def write_tiny_assets(out_dir: Path, seed: int) -> None:
    """The tiny default voice and token2wav model under `out_dir/assets/`: also what a tiny
    checkpoint written by other tools (which write no assets) needs to be served."""
    voice = out_dir / REFERENCE_VOICE_FILE
    voice.parent.mkdir(parents=True, exist_ok=True)
    write_wav_pcm16(voice, synthesize_reference_voice(seed), REFERENCE_VOICE_SAMPLE_RATE)
    _write_token2wav_assets(out_dir, seed)  # -> out_dir / TOKEN2WAV_DIR


def _write_token2wav_assets(out_dir: Path, seed: int) -> None:
    # Imported here for the same reason as tiny_weights; the token2wav package owns the format.
    from backends.models.token2wav import Token2WavConfig, write_token2wav_assets

    write_token2wav_assets(out_dir, Token2WavConfig.tiny(), seed)


def _write_json(file: Path, data: Any) -> None:
    file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_marker(path: Path) -> Any:
    try:
        raw = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return raw.get(TINY_MARKER_KEY) if isinstance(raw, dict) else None


def _is_current(path: Path, seed: int) -> bool:
    """A complete tiny checkpoint of this seed and generator format is already at `path`."""
    if _read_marker(path) != tiny_marker(seed):
        return False
    return all((path / name).is_file() for name in _REQUIRED_FILES)


def _publish(staging: Path, path: Path, seed: int) -> None:
    """Rename `staging` to `path`, moving a stale tiny checkpoint out of the way first."""
    if _is_current(path, seed):
        return  # another process published the same bytes while we generated: keep theirs
    stale_root = None
    if path.exists() and any(path.iterdir()):
        stale_root = Path(tempfile.mkdtemp(prefix=f".{path.name}.stale.", dir=path.parent))
        try:
            os.rename(path, stale_root / path.name)
        except FileNotFoundError:
            pass  # another process moved it first
    try:
        os.rename(staging, path)  # atomic; also replaces an empty directory
    except OSError:
        # Another process published first (the target is now a non-empty directory).
        if not _is_current(path, seed):
            raise
    finally:
        if stale_root is not None:
            shutil.rmtree(stale_root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """`minicpmo-make-tiny --out DIR --seed N`: generate (or reuse) a tiny checkpoint."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory")
    parser.add_argument("--seed", type=int, default=0, help="weight/voice seed (default 0)")
    args = parser.parse_args(argv)
    print(ensure_tiny_checkpoint(args.out, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
