"""The token-id sets of the duplex policy and their logits masks, shared by every session.

The sets depend on the tokenizer and the special tokens only, so one `PolicyIds` per engine
serves all sessions. Its [vocab] bool masks are built once per (set, vocab, device): with the
full-size vocabulary and a small tokenizer (the `full-random` profile) the bad ids are ~150k,
and building their mask per session put ~30 ms into every session's first text token.
`fill` writes -inf on a set as a few slice fills where its ids form few runs (the bad ids are
one range plus tts_pad): ~0.03 ms per token on a 152k row instead of ~0.14 for a masked fill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from backends.checkpoint.tokenizer import SpecialTokens
    from backends.runner.types import RunnerConfig

ID_SETS = ("chunk_eos_ids", "special_ids", "bad_ids")
MAX_RUNS = 64  # beyond this many runs of consecutive ids a set is filled through its mask


class PolicyIds:
    def __init__(self, special: SpecialTokens, bad_token_ids: Iterable[int] = (),
                 extra_special_ids: Iterable[int] = ()) -> None:
        self.special_ids = special_token_ids(special) | frozenset(extra_special_ids)
        self.bad_ids = tuple(sorted(set(bad_token_ids) | {special.tts_pad}))
        self.chunk_eos_ids = (special.chunk_eos,)
        self._masks: dict[tuple[str, int, torch.device], torch.Tensor] = {}
        self._runs = {name: _runs(getattr(self, name)) for name in ID_SETS}
        # per-row lookups of a compact row's draw (~2 us each uncached); a few keys per engine
        self._host_masks: dict[tuple[str, int], np.ndarray] = {}
        self._covers: dict[tuple[str, int, int], bool] = {}

    def fill(self, logits: torch.Tensor, id_set: str) -> None:
        """-inf in place on the ids of `id_set` below len(logits) ([vocab] float32)."""
        runs = self._runs.get(id_set)
        if runs is None or len(runs) > MAX_RUNS:
            logits.masked_fill_(self.mask(id_set, logits.shape[0], logits.device), float("-inf"))
            return
        for start, stop in runs:
            logits[start:stop] = float("-inf")  # slices past the end are empty

    def host_mask(self, id_set: str, vocab: int) -> np.ndarray:
        """`mask` on the host as numpy: looked up at a few ids (a compact row's candidates)."""
        key = (id_set, vocab)
        mask = self._host_masks.get(key)
        if mask is None:
            mask = self._host_masks[key] = self.mask(id_set, vocab, torch.device("cpu")).numpy()
        return mask

    def covers(self, id_set: str, start: int, stop: int) -> bool:
        """Whether every id in [start, stop) is in `id_set` (runs are maximal: one holds it)."""
        key = (id_set, start, stop)
        covered = self._covers.get(key)
        if covered is None:
            covered = start >= stop or any(a <= start and stop <= b for a, b in self._runs[id_set])
            self._covers[key] = covered
        return covered

    def mask(self, id_set: str, vocab: int, device: torch.device) -> torch.Tensor:
        """[vocab] bool, True on the ids of `id_set` (one of ID_SETS) below `vocab`."""
        if id_set not in ID_SETS:
            raise ValueError(f"unknown id set {id_set!r}; expected one of {ID_SETS}")
        key = (id_set, vocab, device)
        mask = self._masks.get(key)
        if mask is None:
            ids = [token for token in getattr(self, id_set) if 0 <= token < vocab]
            mask = torch.zeros(vocab, dtype=torch.bool, device=device)
            mask[torch.tensor(ids, dtype=torch.int64, device=device)] = True
            self._masks[key] = mask
        return mask


def _runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted non-negative ids as [start, stop) runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for token in sorted(set(t for t in ids if t >= 0)):
        if runs and runs[-1][1] == token:
            runs[-1] = (runs[-1][0], token + 1)
        else:
            runs.append((token, token + 1))
    return runs


def special_token_ids(special: SpecialTokens) -> frozenset[int]:
    """Every id the SpecialTokens dataclass names."""
    values = (getattr(special, f.name) for f in dataclasses.fields(special))
    return frozenset(value for value in values if isinstance(value, int))


def policy_runner_config(
    config: RunnerConfig, vocab_size: int, special: SpecialTokens, eos_id: int | None = None
) -> RunnerConfig:
    """The runner settings the policy's host draws rely on: top candidates among the ids the
    tokenizer has (past them: embedding padding, masked as bad ids), and the raw logits of
    chunk_eos (the boundary draw reads it) and of the EOS id (the listen scale's target) in
    every compact row whatever their rank."""
    probes = (special.chunk_eos,) if eos_id is None else (special.chunk_eos, eos_id)
    return dataclasses.replace(config, candidate_ids=vocab_size, probe_ids=probes)
