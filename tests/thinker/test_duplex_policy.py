"""DuplexPolicy: one test per rule of
docs/model_facts.md#listen-or-speak-the-duplex-policy, plus the reply-shape knobs.

Strategy: drive the hook exactly as the runner does (before_sample on a float32 logits row,
then after_sample with the final token) with logits built to make each rule decisive, and the
runner's seeded per-position generators. Statistical checks use many seeds with a bound of
several standard deviations, the measured value in the message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch

from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.runner.host_draws import TopCandidates
from backends.runner.types import SampleContext
from backends.thinker.duplex_policy import DuplexPolicy
from backends.thinker.policy_config import PolicyConfig
from backends.thinker.policy_masks import PolicyIds

VOCAB = 1024  # tiny tokenizer ids 0..999 + 24 padding rows of the embedding table
BAD_IDS = range(1000, VOCAB)
NUM_SEEDS = 1500
SIGMAS = 5.0  # a fair implementation fails a 5-sigma bound about once in 2 million runs


def _ctx(seed: int = 0, position: int = 100) -> SampleContext:
    return SampleContext("r", position, [])


def _policy(
    tokenizer: TextTokenizer, special: SpecialTokens, seed: int = 0, **cfg: object
) -> DuplexPolicy:
    """The policy's seed is the request's (the runner seeds its SamplingContext from it)."""
    return DuplexPolicy(special, tokenizer, PolicyConfig(**cfg), BAD_IDS,  # type: ignore[arg-type]
                        seed=seed)


def _logits(favour: dict[int, float] | None = None) -> torch.Tensor:
    row = torch.zeros(VOCAB)
    for token, value in (favour or {}).items():
        row[token] = value
    return row


def _sample(policy: DuplexPolicy, logits: torch.Tensor, seed: int = 0, position: int = 100) -> int:
    ctx = _ctx(seed, position)
    forced = policy.before_sample(logits.clone(), ctx)
    assert forced is not None  # the duplex policy always decides the token itself
    return policy.after_sample(forced, ctx)


def _text_ids(tokenizer: TextTokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def _run_unit(
    policy: DuplexPolicy, logits_fn: Callable[[int], torch.Tensor], seed: int = 0
) -> list[int]:
    tokens: list[int] = []
    terminators = policy.terminators
    while not tokens or tokens[-1] not in terminators:
        tokens.append(_sample(policy, logits_fn(len(tokens)), seed, 200 + len(tokens)))
        assert len(tokens) <= 20
    return tokens


# ---- rule 1: force-listen pre-pass ------------------------------------------------------------


def test_force_listen_flag_forces_listen_and_closes_the_turn(tokenizer, special) -> None:
    policy = _policy(tokenizer, special)
    policy.open_turn_with_text()
    policy.begin_unit(force_listen=True, speech=[True])
    token = _sample(policy, _logits({special.speak: 50.0}))
    assert token == special.listen
    assert not policy.latches.turn_open
    assert policy.latches.pending_terminator == special.listen


def test_silent_unit_with_nothing_to_answer_is_forced_to_listen(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, listen_when_silent=True)
    policy.begin_unit(force_listen=False, speech=[False])
    assert _sample(policy, _logits({special.speak: 50.0})) == special.listen


def test_silent_unit_is_the_model_s_to_decide_by_default(tokenizer, special) -> None:
    """The official decoder has no silence rule: without the option a silent unit decides."""
    policy = _policy(tokenizer, special)
    policy.begin_unit(force_listen=False, speech=[False])
    assert _sample(policy, _logits({special.speak: 50.0})) == special.speak


def test_speech_unit_is_not_forced(tokenizer, special) -> None:
    policy = _policy(tokenizer, special)
    policy.begin_unit(force_listen=False, speech=[True])
    assert _sample(policy, _logits({special.speak: 50.0})) == special.speak


def test_pending_speech_context_lifts_the_silence_force(tokenizer, special) -> None:
    """A silent unit right after user speech must let the model decide (answer)."""
    policy = _policy(tokenizer, special)
    policy.begin_unit(False, [True])
    _sample(policy, _logits({special.listen: 50.0}))
    policy.begin_unit(False, [False])
    assert _sample(policy, _logits({special.speak: 50.0})) == special.speak


# ---- rule 2: async lookahead guard ------------------------------------------------------------


def test_lookahead_after_a_terminator_reemits_it_without_state_change(tokenizer, special) -> None:
    policy = _policy(tokenizer, special)
    policy.begin_unit(False, [True])
    word = _text_ids(tokenizer, "hi")[0]
    _sample(policy, _logits({word: 50.0}))
    assert _sample(policy, _logits({special.chunk_eos: 50.0})) == special.chunk_eos
    history = list(policy.latches.history)
    unit = policy.unit_tokens
    token = _sample(policy, _logits({special.speak: 50.0}))
    assert token == special.chunk_eos
    assert list(policy.latches.history) == history and policy.unit_tokens == unit


# ---- rule 3: hard length cut ------------------------------------------------------------------


def test_twentieth_token_is_chunk_eos(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, max_chars_per_unit=10_000, temperature=0.0)
    policy.begin_unit(False, [True])
    words = _text_ids(tokenizer, " the and of to in is")
    tokens = _run_unit(policy, lambda i: _logits({words[i % len(words)]: 30.0}))
    assert len(tokens) == 20 and tokens[-1] == special.chunk_eos
    assert special.chunk_eos not in tokens[:-1]


def test_request_max_tokens_caps_the_unit_further(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, max_chars_per_unit=10_000, temperature=0.0,
                     max_tokens_per_unit=6)
    policy.begin_unit(False, [True])
    words = _text_ids(tokenizer, " the and of to in is")
    tokens = _run_unit(policy, lambda i: _logits({words[i % len(words)]: 30.0}))
    assert len(tokens) == 6 and tokens[-1] == special.chunk_eos


# ---- rule 4: boundary draw from the raw softmax -----------------------------------------------


def test_greedy_boundary_draw_takes_argmax_chunk_eos(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0)
    policy.begin_unit(False, [True])
    word = _text_ids(tokenizer, "hi")[0]
    assert _sample(policy, _logits({special.chunk_eos: 5.0, word: 4.0})) == special.chunk_eos


def test_boundary_draw_uses_the_untempered_softmax(tokenizer, special) -> None:
    """chunk_eos has raw probability 0.3 against one word; at temperature 0.2 a tempered draw
    would give it about 0.01. The rate must match the raw 0.3."""
    word = _text_ids(tokenizer, "hi")[0]
    logits = torch.full((VOCAB,), -1e4)
    logits[special.chunk_eos] = math.log(0.3)
    logits[word] = math.log(0.7)
    hits = 0
    for seed in range(NUM_SEEDS):
        policy = _policy(tokenizer, special, seed=seed, temperature=0.2)
        policy.begin_unit(False, [True])
        hits += _sample(policy, logits, seed) == special.chunk_eos
    rate, sigma = hits / NUM_SEEDS, math.sqrt(0.3 * 0.7 / NUM_SEEDS)
    assert abs(rate - 0.3) < SIGMAS * sigma, f"chunk_eos rate {rate:.3f}, expected 0.3"


# ---- rule 5: masks, penalty, temperature / top-k / top-p --------------------------------------


def test_tts_pad_bad_ids_and_chunk_eos_are_masked_after_the_draw(tokenizer, special) -> None:
    word = _text_ids(tokenizer, "hi")[0]
    favour = {special.tts_pad: 60.0, 1005: 60.0, special.chunk_eos: -1.0, word: 1.0}
    for seed in range(50):
        policy = _policy(tokenizer, special, seed=seed)
        policy.begin_unit(False, [True])
        token = _sample(policy, _logits(favour), seed)
        assert token not in (special.tts_pad, 1005)


def test_sessions_share_the_engines_id_masks(tokenizer, special) -> None:
    ids = PolicyIds(special, BAD_IDS)
    word = _text_ids(tokenizer, "hi")[0]
    config = PolicyConfig(temperature=0.0)
    policies = [DuplexPolicy(special, tokenizer, config, seed=s, ids=ids) for s in (1, 2)]
    for seed, policy in enumerate(policies):
        policy.begin_unit(False, [True])
        assert _sample(policy, _logits({special.tts_pad: 60.0, 1005: 60.0, word: 1.0}), seed) == word
    mask = ids.mask("bad_ids", VOCAB, torch.device("cpu"))
    assert mask is ids.mask("bad_ids", VOCAB, torch.device("cpu"))  # built once, for both
    assert mask[special.tts_pad] and mask[1005] and not mask[word]
    with pytest.raises(ValueError, match="unknown id set"):
        ids.mask("every_id", VOCAB, torch.device("cpu"))


@pytest.mark.parametrize("bad", [BAD_IDS, range(0, VOCAB, 7), [], [3, 4, 5, 900, VOCAB + 5]])
def test_fill_equals_the_masked_fill(special, bad) -> None:
    """Runs of slice fills or the mask (sets of many runs): the same -inf positions."""
    ids = PolicyIds(special, bad)
    for id_set in ("chunk_eos_ids", "special_ids", "bad_ids"):
        row = torch.randn(VOCAB)
        want = row.masked_fill(ids.mask(id_set, VOCAB, torch.device("cpu")), float("-inf"))
        ids.fill(row, id_set)
        assert torch.equal(row, want), id_set


def test_repetition_penalty_applies_to_recent_distinct_tokens(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0, max_chars_per_unit=10_000)
    first, second = _text_ids(tokenizer, " the and")[:2]
    policy.begin_unit(False, [True])
    assert _sample(policy, _logits({first: 30.0})) == first
    # 2.0 / 1.05 = 1.905 < 1.95: the seen token loses to an unseen one.
    assert _sample(policy, _logits({first: 2.0, second: 1.95})) == second


def test_repetition_penalty_window_is_the_last_512(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0)
    first, second = _text_ids(tokenizer, " the and")[:2]
    policy.latches.history.extend([first] + [special.speak] * 512)
    policy.begin_unit(False, [True])
    assert _sample(policy, _logits({first: 2.0, second: 1.95})) == first


def test_temperature_applies_after_the_boundary_draw(tokenizer, special) -> None:
    """Raw probabilities 0.7 / 0.3; temperature 0.5 squares them: 0.49 / 0.09 -> 0.845."""
    first, second = 300, 301
    logits = torch.full((VOCAB,), -1e4)
    logits[first], logits[second] = math.log(0.7), math.log(0.3)
    hits = 0
    for seed in range(NUM_SEEDS):
        policy = _policy(tokenizer, special, seed=seed, temperature=0.5, top_p=1.0)
        policy.begin_unit(False, [True])
        hits += _sample(policy, logits, seed) == first
    expected = 0.49 / 0.58
    rate, sigma = hits / NUM_SEEDS, math.sqrt(expected * (1 - expected) / NUM_SEEDS)
    assert abs(rate - expected) < SIGMAS * sigma, f"rate {rate:.3f}, expected {expected:.3f}"


def test_shifted_positions_reseed_the_draws(tokenizer, special) -> None:
    """After a window cut the same RoPE position must not replay the same random draw: with
    an offset the draw is the one of the shifted stream position."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(4))

    def draw(offset: int, position: int) -> int:
        policy = _policy_seeded(tokenizer, special, seed=9)
        policy.position_offset = offset
        policy.begin_unit(False, [True])
        return _sample(policy, logits, seed=9, position=position)

    draws = [draw(0, 100 + k) for k in range(40)]
    assert [draw(k, 100) for k in range(40)] == draws
    assert len(set(draws)) > 1


def _policy_seeded(tokenizer: TextTokenizer, special: SpecialTokens, seed: int) -> DuplexPolicy:
    return DuplexPolicy(special, tokenizer, PolicyConfig(temperature=1.0, top_k=1000, top_p=1.0),
                        BAD_IDS, seed=seed)


def test_top_k_keeps_twenty(tokenizer, special) -> None:
    """25 candidates with nearly equal logits: only the 20 largest may ever be drawn."""
    candidates = list(range(300, 325))
    favour = {token: 10.0 - 0.001 * i for i, token in enumerate(candidates)}
    seen = set()
    for seed in range(300):
        policy = _policy(tokenizer, special, seed=seed, temperature=1.0, top_p=1.0)
        policy.begin_unit(False, [True])
        seen.add(_sample(policy, _logits(favour), seed))
    assert seen <= set(candidates[:20]) and len(seen) > 10


def test_top_p_drops_the_tail(tokenizer, special) -> None:
    """Probabilities 0.85 / 0.15 at temperature 1: top-p 0.8 keeps only the first token."""
    first, second = 300, 301
    logits = torch.full((VOCAB,), -1e4)
    logits[first], logits[second] = math.log(0.85), math.log(0.15)
    for seed in range(200):
        policy = _policy(tokenizer, special, seed=seed, temperature=1.0)
        policy.begin_unit(False, [True])
        assert _sample(policy, logits, seed) == first


def test_sampling_is_a_function_of_seed_and_position(tokenizer, special) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3))

    def draw(seed: int, position: int) -> int:
        policy = _policy(tokenizer, special, seed=seed, temperature=1.0)
        policy.begin_unit(False, [True])
        return _sample(policy, logits, seed, position)

    assert [draw(1, 5) for _ in range(3)] == [draw(1, 5)] * 3
    assert len({draw(seed, 5) for seed in range(40)}) > 1


# ---- rule 6: 28-character cut -----------------------------------------------------------------


def test_character_cut_at_28(tokenizer, special) -> None:
    text = " the and of to in is it you that he was"
    words = _text_ids(tokenizer, text)
    policy = _policy(tokenizer, special, temperature=0.0, max_chars_per_unit=28)
    policy.begin_unit(False, [True])
    tokens = _run_unit(policy, lambda i: _logits({words[i % len(words)]: 30.0}))
    assert tokens[-1] == special.chunk_eos
    spoken = tokenizer.decode(tokens[:-1])
    with_next = tokenizer.decode(tokens[:-1] + [words[(len(tokens) - 1) % len(words)]])
    assert len(spoken) < 28 <= len(with_next), (spoken, with_next)


def test_character_cut_lets_special_candidates_through(tokenizer, special) -> None:
    """At 4 characters with a limit of 5, another word is cut but a special token is not."""
    the, also = _text_ids(tokenizer, " the and")[:2]
    outcomes = []
    for candidate in (also, special.turn_eos):
        policy = _policy(tokenizer, special, temperature=0.0, max_chars_per_unit=5)
        policy.begin_unit(False, [True])
        _sample(policy, _logits({the: 30.0}))
        outcomes.append(_sample(policy, _logits({candidate: 30.0})))
    assert outcomes == [special.chunk_eos, special.turn_eos]


def test_character_count_restarts_after_turn_eos(tokenizer, special) -> None:
    """A new turn inside the unit starts a new text: 4 characters before <|turn_eos|> do not
    count against the 4 after it (limit 5)."""
    the, also = _text_ids(tokenizer, " the and")[:2]
    policy = _policy(tokenizer, special, temperature=0.0, max_chars_per_unit=5)
    policy.begin_unit(False, [True])
    spoken = [_sample(policy, _logits({token: 30.0})) for token in (the, special.turn_eos, also)]
    assert spoken == [the, special.turn_eos, also]


# ---- rule 7: mid-turn listen rewrite ----------------------------------------------------------


def test_listen_in_an_open_turn_becomes_tts_bos(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0)
    policy.open_turn_with_text()
    policy.begin_unit(False, [True])
    assert _sample(policy, _logits({special.listen: 30.0})) == special.tts_bos


def test_listen_without_a_turn_stays_listen(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0)
    policy.begin_unit(False, [True])
    assert _sample(policy, _logits({special.listen: 30.0})) == special.listen


# ---- rule 8: latches --------------------------------------------------------------------------


def test_latches_follow_the_final_tokens(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0)
    latches = policy.latches
    policy.begin_unit(False, [True])
    assert latches.pending_speech_context and not latches.turn_open
    _sample(policy, _logits({special.speak: 30.0}))
    assert latches.turn_open and latches.pending_speech_context  # speak is not content
    _sample(policy, _logits({_text_ids(tokenizer, "hi")[0]: 30.0}))
    assert not latches.pending_speech_context
    _sample(policy, _logits({special.turn_eos: 30.0}))
    assert not latches.turn_open and latches.pending_terminator is None
    _sample(policy, _logits({special.chunk_tts_eos: 30.0}))
    assert latches.pending_terminator == special.chunk_tts_eos
    assert len(latches.history) == 4


# ---- knobs ------------------------------------------------------------------------------------


def _random_logits(special: SpecialTokens) -> Callable[[int], torch.Tensor]:
    """Random rows whose special tokens dominate: the knob must still pick text."""
    generator = torch.Generator().manual_seed(11)

    def make(_: int) -> torch.Tensor:
        row = torch.randn(VOCAB, generator=generator)
        for token in (special.listen, special.chunk_eos, special.turn_eos, special.speak):
            row[token] = 40.0
        return row

    return make


def test_reply_knob_shapes_a_two_unit_reply(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, reply_units=2, reply_tokens_per_unit=4)
    policy.open_turn_with_text()
    logits = _random_logits(special)
    units = []
    for _ in range(3):
        policy.begin_unit(False, [False])
        units.append(_run_unit(policy, logits))
    first, last, after = units
    specials = policy.special_ids
    assert first[0] == special.speak and first[-1] == special.chunk_eos and len(first) == 6
    assert last[0] == special.speak and last[-2:] == [special.turn_eos, special.chunk_eos]
    assert all(t not in specials for t in first[1:5] + last[1:5])
    assert len(last) == 7
    assert after == [special.listen]


def test_reply_knob_opens_a_turn_when_speech_is_followed_by_silence(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, reply_units=1, reply_tokens_per_unit=2)
    logits = _random_logits(special)
    policy.begin_unit(False, [True])
    assert _run_unit(policy, logits) == [special.listen]  # user still talking, no turn
    policy.begin_unit(False, [False])
    reply = _run_unit(policy, logits)
    assert reply[0] == special.speak and reply[-2:] == [special.turn_eos, special.chunk_eos]
    policy.begin_unit(False, [False])
    assert _run_unit(policy, logits) == [special.listen]


def test_force_listen_beats_the_reply_knob(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, reply_units=2, reply_tokens_per_unit=2)
    policy.open_turn_with_text()
    policy.begin_unit(True, [False])
    assert _run_unit(policy, _random_logits(special)) == [special.listen]


@pytest.mark.parametrize(
    "knobs",
    [dict(reply_units=2), dict(reply_tokens_per_unit=3), dict(reply_units=1, reply_tokens_per_unit=18)],
)
def test_reply_knobs_are_validated(knobs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="reply"):
        PolicyConfig(**knobs)


def test_runner_candidates_serve_the_draw_unless_the_penalty_raises(tokenizer, special) -> None:
    """The runner's raw top candidates (`SampleContext.candidates`) give the draw the row
    gives; a repetition penalty below 1 raises a repeated token (here 400, outside them) over
    them, and then the policy must scan the row."""
    favour = {300 + i: 10.0 - 0.001 * i for i in range(25)}
    favour[400] = 6.0
    raw = _logits(favour)
    values, ids = torch.topk(raw, 25)
    hint = TopCandidates(values.numpy(), ids.numpy(), VOCAB)
    for penalty, expected in ((1.05, 300), (0.5, 400)):
        policy = _policy(tokenizer, special, seed=3, temperature=1.0, top_k=1,
                         repetition_penalty=penalty)  # fmt: skip
        policy.begin_unit(False, [True])
        policy.latches.history.append(400)
        ctx = dataclasses.replace(_ctx(3), candidates=hint)
        assert policy.before_sample(raw.clone(), ctx) == expected, penalty


# ---- the official decoder's arithmetic -------------------------------------------------------


def test_repetition_penalty_divides_negative_logits_too(tokenizer, special) -> None:
    """The official decoder divides a repeated id's logit whatever its sign: -2.0 / 1.05 =
    -1.905 beats an unseen -1.95 (a sign-aware penalty would give -2.1 and lose)."""
    first, second = _text_ids(tokenizer, " the and")[:2]
    policy = _policy(tokenizer, special, temperature=0.0)
    policy.latches.history.append(first)
    policy.begin_unit(False, [True])
    row = torch.full((VOCAB,), -10.0)
    row[first], row[second] = -2.0, -1.95
    assert _sample(policy, row) == first


def test_turn_eos_takes_the_length_penalty(tokenizer, special) -> None:
    """1.1 on <|turn_eos|>: a positive logit divided (2.0 -> 1.82 < 1.9), a negative one
    multiplied (-1.0 -> -1.1 < -1.05)."""
    word = _text_ids(tokenizer, " the")[0]
    for eos, other in ((2.0, 1.9), (-1.0, -1.05)):
        policy = _policy(tokenizer, special, temperature=0.0)
        policy.begin_unit(False, [True])
        row = torch.full((VOCAB,), -10.0)
        row[special.turn_eos], row[word] = eos, other
        assert _sample(policy, row) == word, eos
        unpenalised = _policy(tokenizer, special, temperature=0.0, length_penalty=1.0)
        unpenalised.begin_unit(False, [True])
        assert _sample(unpenalised, row) == special.turn_eos, eos


def test_listen_scale_multiplies_the_eos_logit(tokenizer, special) -> None:
    """The official decoder scales the logit of the tokenizer's EOS id (its `listen_id`)."""
    word = _text_ids(tokenizer, " the")[0]
    eos = special.im_end
    row = torch.full((VOCAB,), -10.0)
    row[eos], row[word] = 2.0, 2.5
    for scale, expected in ((1.0, word), (1.5, eos)):
        policy = DuplexPolicy(special, tokenizer, PolicyConfig(temperature=0.0, listen_prob_scale=scale),
                              BAD_IDS, eos_id=eos)
        policy.begin_unit(False, [True])
        assert _sample(policy, row) == expected, scale


def test_penalty_window_holds_the_decoder_s_own_draws(tokenizer, special) -> None:
    """Forced listens and the boundary draw's chunk_eos never join the window; a listen that
    became <|tts_bos|> joins it as the listen the decoder drew."""
    policy = _policy(tokenizer, special, temperature=0.0)
    policy.begin_unit(True, [True])
    assert _sample(policy, _logits()) == special.listen
    policy.begin_unit(False, [True])
    assert _sample(policy, _logits({special.chunk_eos: 50.0})) == special.chunk_eos
    assert policy.latches.history.tokens() == []
    policy.begin_unit(False, [True])
    word = _text_ids(tokenizer, " the")[0]
    assert _sample(policy, _logits({word: 30.0})) == word
    assert _sample(policy, _logits({special.listen: 30.0})) == special.tts_bos
    assert policy.latches.history.tokens() == [word, special.listen]


# ---- option: max_reply_tokens ----------------------------------------------------------------


def _text_logits(tokenizer: TextTokenizer, special: SpecialTokens) -> Callable[[int], torch.Tensor]:
    """A row that makes the unit speak: <|speak|> first, then one text id, never a terminator."""
    text = _text_ids(tokenizer, "hello")[0]
    return lambda index: _logits({special.speak: 50.0} if index == 0 else {text: 50.0})


def test_max_reply_tokens_ends_the_turn_after_that_many_text_tokens(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0, max_reply_tokens=5)
    policy.open_turn_with_text()
    policy.begin_unit(force_listen=False, speech=[False])
    unit = _run_unit(policy, _text_logits(tokenizer, special))
    text = [t for t in unit if t not in policy.special_ids]
    assert len(text) == 5 and unit[-2:] == [special.turn_eos, special.chunk_eos], unit
    assert not policy.latches.turn_open and policy.latches.reply_tokens == 0


def test_max_reply_tokens_counts_across_units_and_keeps_the_unit_size(tokenizer, special) -> None:
    """11 text tokens in units of at most 8: the first unit is cut by the hard cut (speak, 6
    text tokens, chunk_eos), the second ends the turn after 5 more; no unit is longer."""
    policy = _policy(tokenizer, special, temperature=0.0, max_reply_tokens=11, max_tokens_per_unit=8)
    policy.open_turn_with_text()
    units = []
    for _ in range(2):
        policy.begin_unit(force_listen=False, speech=[False])
        units.append(_run_unit(policy, _text_logits(tokenizer, special)))
    assert all(len(unit) <= 8 for unit in units), units
    text = [[t for t in unit if t not in policy.special_ids] for unit in units]
    assert [len(t) for t in text] == [6, 5] and special.turn_eos not in units[0]
    assert units[1][-2:] == [special.turn_eos, special.chunk_eos]


def test_a_spent_budget_at_a_units_start_speaks_then_ends_the_turn(tokenizer, special) -> None:
    policy = _policy(tokenizer, special, temperature=0.0, max_reply_tokens=6, max_tokens_per_unit=8)
    policy.open_turn_with_text()
    policy.begin_unit(force_listen=False, speech=[False])
    first = _run_unit(policy, _text_logits(tokenizer, special))  # speak + 6 text + chunk_eos (cut)
    assert len(first) == 8 and special.turn_eos not in first, first
    policy.begin_unit(force_listen=False, speech=[False])
    second = _run_unit(policy, _text_logits(tokenizer, special))
    assert second == [special.speak, special.turn_eos, special.chunk_eos]
