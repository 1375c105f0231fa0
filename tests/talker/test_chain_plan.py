"""The Talker engine's choice between one step and a decode chain (backends/talker/chain_plan).

Strategy: the pure rule on hand-made inputs: any prefill in the batch means one step; else the
longest configured length that the row with the most draws left can use whole and every row
has KV room for; and the runner config the engine builds (chains only with the device policy
on the fast path, the default unless configured, () off).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from backends.runner.types import RunnerConfig, StepInput
from backends.talker.chain_plan import DEFAULT_CHAIN_LENGTHS, chain_config, chain_length

DECODE = StepInput("r", [5])
PREFILL = StepInput("r", [0, 0], torch.zeros(2, 4))


def chunks(*draws_left: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(draws_left=n) for n in draws_left]


def test_a_prefill_in_the_batch_means_one_step() -> None:
    assert chain_length((4, 8), [DECODE, PREFILL], chunks(25, 26), [100, 100]) == 1
    assert chain_length((4, 8), [DECODE, DECODE], chunks(25, 26), [100, 100]) == 8


def test_the_longest_length_some_row_uses_whole_and_all_rows_fit() -> None:
    assert chain_length((4, 8), [DECODE] * 2, chunks(1, 9), [100, 100]) == 8
    assert chain_length((4, 8), [DECODE] * 2, chunks(1, 7), [100, 100]) == 4
    assert chain_length((4, 8), [DECODE] * 2, chunks(3, 2), [100, 100]) == 1
    assert chain_length((4, 8), [DECODE] * 2, chunks(25, 25), [100, 6]) == 4
    assert chain_length((), [DECODE], chunks(25), [100]) == 1


def test_chain_config() -> None:
    fast = RunnerConfig(num_blocks=4, max_num_reqs=2, max_model_len=16,
                        attention_backend="triton")  # fmt: skip
    reference = RunnerConfig(num_blocks=4, max_num_reqs=2, max_model_len=16)
    assert chain_config(fast, None, True).decode_chain_lengths == DEFAULT_CHAIN_LENGTHS
    assert chain_config(fast, (4,), True).decode_chain_lengths == (4,)
    assert chain_config(fast, None, False).decode_chain_lengths == ()
    assert chain_config(reference, None, True).decode_chain_lengths == ()
    configured = RunnerConfig(num_blocks=4, max_num_reqs=2, max_model_len=16,
                              attention_backend="triton", decode_chain_lengths=())  # fmt: skip
    assert chain_config(configured, None, True).decode_chain_lengths == ()
