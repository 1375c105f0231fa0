"""When the Talker engine runs a decode chain (K frames per host round trip) instead of a step.

A chain needs every forwarded request in plain decode (its next input is its last code, no
condition prefill in the batch), the device chunk policy (it forces EOS at a chunk's budget
and after its EOS, so draws past a row's end are EOS, kept out of the penalty window, and
the engine drops them), and KV room for K rows in every reservation. The length is the
longest configured one that at least one row can use whole (no chain of pure waste) and
every row has room for; rows that end earlier idle to the chain's end, so a condition that
arrives or becomes startable meanwhile waits at most one chain.

Why 12 by default: a Talker chunk is 1 prefill + 25 decode draws; 12 + 12 + 1 reaches the 25th
frame after three host round trips instead of four with chains of 8 (H200, 25 frames in
`perf/bench_audio_tail.py --stages talker`: 15.3 / 24.1 ms at batch 1 / 16, median of three runs,
against 16.1 / 25.5, mean of two, with 8; current numbers: perf/results/stages_h200.md), while a
new condition waits at most 12 decode steps (~6-10 ms), small against the 25-frame group a sink
receives at once anyway. Conditions that became startable during a chain start together in the
next step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from backends.runner.types import RunnerConfig, StepInput
from backends.talker.request_state import ActiveChunk

DEFAULT_CHAIN_LENGTHS = (12,)


def chain_config(
    runner_config: RunnerConfig, lengths: tuple[int, ...] | None, device_policy: bool
) -> RunnerConfig:
    """The runner config with the chain lengths the engine will use: `lengths` if given,
    else the config's own if set, else DEFAULT_CHAIN_LENGTHS (() = chains off, either way);
    none without the device policy or the fast path (host hooks need the logits rows)."""
    if not device_policy or not runner_config.is_fast_path:
        lengths = ()
    elif lengths is None:
        lengths = runner_config.decode_chain_lengths
        lengths = DEFAULT_CHAIN_LENGTHS if lengths is None else lengths
    return dataclasses.replace(runner_config, decode_chain_lengths=lengths)


def is_plain_decode(step_input: StepInput) -> bool:
    return step_input.embeds is None and step_input.num_rows == 1


def chain_length(
    lengths: Sequence[int],
    inputs: list[StepInput],
    chunks: Sequence[ActiveChunk | None],
    rooms: list[int],
) -> int:
    """Steps to run now: a configured chain length, or 1 (one ordinary step).

    chunks: each input's active chunk; rooms: each input's KV rows left in its reservation."""
    if not inputs or not all(is_plain_decode(step_input) for step_input in inputs):
        return 1
    draws_left = max(chunk.draws_left if chunk is not None else 1 for chunk in chunks)
    fits = [n for n in lengths if n <= draws_left and n <= min(rooms)]
    return max(fits, default=1)
