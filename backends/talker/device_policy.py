"""One Talker request's chunk policy when it runs on the device: a handle on its table row.

The engine talks to every request's policy through the same few calls (`ChunkPolicy` in
request_state.py); here they become host writes to the shared `TalkerPolicyTable`. The
request's row follows it through re-admissions (turn starts, rollovers): `detach` keeps a
device copy of the penalty window before the runner frees the slot and `attach` puts it in
the new slot, as the host policy's history survives in its hook object.

`use_device_policy` decides per engine: the device policy wherever the runner samples on the
device (its fast path), the host hook on the CPU reference path and for custom policies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from backends.models.talker_policy import (
    CHUNK_BUDGETS,
    ChunkKind,
    TalkerChunkPolicy,
    TalkerSamplingConfig,
)
from backends.runner.types import RunnerConfig, SamplingHook
from backends.talker.policy_guard import PolicyGuard
from backends.talker.policy_table import TalkerPolicyTable
from backends.talker.request_state import ChunkPolicy


class DevicePolicy:
    """A request's row in the `TalkerPolicyTable`; nothing of it runs on the host per step."""

    error: Exception | None = None  # device work cannot fail one request alone

    def __init__(self, table: TalkerPolicyTable) -> None:
        self.table = table
        self._slot: int | None = None
        self._history: torch.Tensor | None = None  # the window between detach and attach

    @property
    def runner_hook(self) -> SamplingHook | None:
        return None

    def attach(self, slot: int) -> None:
        """The request was admitted into `slot`: switch the policy on there."""
        self.table.open(slot, self._history)
        self._slot, self._history = slot, None

    def detach(self, slot: int) -> None:
        """The request is about to leave `slot` (re-admission): keep its penalty window."""
        self._history = self.table.history(slot)
        self._slot = None

    def begin_chunk(self, kind: ChunkKind) -> None:
        if self._slot is None:
            raise RuntimeError("begin_chunk on a Talker request that holds no runner slot")
        self.table.begin_chunk(self._slot, CHUNK_BUDGETS[kind])


def use_device_policy(
    requested: bool | None,
    runner_config: RunnerConfig,
    sampling: TalkerSamplingConfig,
    has_custom_policy: bool,
) -> bool:
    """requested None: the device policy where it can run (fast path, bounded window)."""
    if requested is None:
        return runner_config.is_fast_path and sampling.penalty_window > 0 and not has_custom_policy
    if requested and has_custom_policy:
        raise ValueError("a custom Talker policy_factory runs as a host hook, not on the device")
    return requested


def make_policy_table(
    requested: bool | None,
    runner_config: RunnerConfig,
    sampling: TalkerSamplingConfig,
    eos_id: int,
    has_custom_policy: bool,
) -> TalkerPolicyTable | None:
    """The engine's device table (its runner's logits processor), or None for host hooks."""
    if not use_device_policy(requested, runner_config, sampling, has_custom_policy):
        return None
    device = torch.device(runner_config.device)
    return TalkerPolicyTable(runner_config.max_num_reqs, device, sampling, eos_id)


def new_chunk_policy(
    table: TalkerPolicyTable | None, factory: Callable[[], TalkerChunkPolicy], eos_id: int
) -> ChunkPolicy:
    """A new request's chunk policy: its row of the device table, else a host hook."""
    return DevicePolicy(table) if table is not None else PolicyGuard(factory(), eos_id)
