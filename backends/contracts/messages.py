"""Contracts between the orchestrator and the stage models.

Each dataclass is one Triton request or response: every field is one tensor whose name is
the field name in upper case (see `tensor_codec`), so the `config.pbtxt` of a stage, the
orchestrator and perf_analyzer input data all derive from these classes and cannot drift.
Field types map to tensors: str -> UTF-8 bytes TYPE_UINT8 [-1], int -> TYPE_INT64 [1], float ->
TYPE_FP32 [1], bool -> TYPE_BOOL [1], np.ndarray -> the dtype and rank named in the comment.
Fields with a default are optional inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.contracts.tensor_codec import array_field

# Actions understood by every stage. `stop` ends a request explicitly: the orchestrator never
# cancels a stage request (Triton 2.51's gRPC frontend can crash when a cancellation races the
# request's end).
ACTION_RUN = "run"
ACTION_STOP = "stop"
# Code2Wav only: the first window of a reply for this request id is on its way (sent as the
# reply's Talker starts); windows that can wait are held until it comes. Answered at once.
ACTION_EXPECT = "expect"

DECISION_LISTEN = "listen"
DECISION_SPEAK = "speak"

# Reference voice audio (REF_AUDIO of the Thinker and of Code2Wav): float32 mono in [-1, 1] at
# 16 kHz, at least one 100 ms hop (the Thinker's reference embedding step), at most 30 s.
REF_AUDIO_SAMPLE_RATE = 16000
MIN_REF_AUDIO_SAMPLES = 1600
MAX_REF_AUDIO_SECONDS = 30


@dataclass(frozen=True, slots=True)
class ThinkerRequest:
    """One append of whole 1-second units to a session's resumable Thinker request."""

    request_id: str  # "<session>.e<epoch>": one resumable request per session epoch
    audio: np.ndarray = array_field(np.float32, -1)  # [num_units * 16000] float32, 16 kHz mono in [-1, 1]
    # append sequence number within the epoch (0 = first: carries the session setup). Seq 0 may
    # hold no audio: the setup alone, whose system context is prefilled at once; it answers no unit.
    seq: int = 0
    action: str = ACTION_RUN
    force_listen: bool = False
    # Session setup, read on seq 0 only.
    instructions: str = ""
    initial_user_text: str = ""
    ref_audio: np.ndarray = array_field(np.float32, -1, optional=True)  # [n] float32 16 kHz, empty = default voice
    temperature: float = -1.0  # < 0: the policy default (0.7); 0 = greedy
    seed: int = 0
    reply_units: int = 0  # policy knob for random weights: force replies of N speak units (0 = off)
    reply_tokens_per_unit: int = 0  # policy knob: text tokens per forced speak unit (0 = off)
    sliding_window_mode: str = ""  # off | basic | context; "" = the engine default (off)
    max_kv_tokens: int = 0  # the session's KV limit (its window slides or it ends there); 0: the engine's
    # The official duplex decoding settings; a negative value means the official default.
    top_k: int = -1  # 20
    top_p: float = -1.0  # 0.8
    max_new_speak_tokens_per_chunk: int = -1  # 20: a unit's tokens, its terminator included
    listen_prob_scale: float = -1.0  # 1.0
    length_penalty: float = -1.0  # 1.1, on <|turn_eos|>
    text_repetition_penalty: float = -1.0  # 1.05
    text_repetition_window_size: int = -1  # 512
    listen_when_silent: int = -1  # option: 1 on, 0 off, < 0 the engine's default
    max_reply_tokens: int = 0  # option: a reply ends after this many text tokens (0 = off)


@dataclass(frozen=True, slots=True)
class ThinkerUnitResult:
    """The Thinker's decision for one unit, and the Talker handoff when it speaks."""

    request_id: str
    seq: int
    unit_index: int  # units since the session (epoch) started
    decision: str  # DECISION_LISTEN | DECISION_SPEAK
    token_ids: np.ndarray = array_field(np.int32, -1)  # [n] every token sampled in this unit, terminator included
    text: str  # transcript of the handed slice (empty for listen)
    tts_token_ids: np.ndarray = array_field(np.int32, -1)  # [m] handed to the Talker (turn_eos included)
    tts_hidden: np.ndarray = array_field(np.float32, -1, -1)  # [m, llm_hidden] hidden row whose input was each handed token
    turn_start: bool
    turn_end: bool  # the slice holds <|turn_eos|>
    segment_end: bool  # the unit ended on chunk_eos / chunk_tts_eos


@dataclass(frozen=True, slots=True)
class TalkerRequest:
    """One condition (a speak unit's handoff) appended to a Talker request."""

    request_id: str
    condition_seq: int  # consecutive per request
    token_ids: np.ndarray = array_field(np.int32, -1)  # [m] Thinker token ids
    hidden: np.ndarray = array_field(np.float32, -1, -1)  # [m, llm_hidden]
    turn_start: bool = False  # replaces the Talker prompt (fresh KV)
    turn_end: bool = False  # 104-frame budget with the boundary EOS mask
    action: str = ACTION_RUN
    seed: int = 42


@dataclass(frozen=True, slots=True)
class TalkerCodes:
    """A group of codec frames (at most 25) streamed by the Talker for one condition."""

    request_id: str
    condition_seq: int
    codes: np.ndarray = array_field(np.int32, -1)  # [k] codec ids in [0, 6561), EOS never included
    finished: bool  # the condition's chunk ended (EOS sampled or budget reached)


@dataclass(frozen=True, slots=True)
class Code2WavRequest:
    """One codec window: left-context codes followed by new codes.

    `ref_audio` is the session's reference voice; it is read on the first window of a cache
    epoch (chunk_seq 0) only, where it selects the voice the epoch's stream starts from
    (prepared once per distinct audio, cached by content hash); empty = the default voice.
    On a later window it is an `invalid_ref_audio` error, as are NaN/Inf, |x| > 1 and a length
    outside [MIN_REF_AUDIO_SAMPLES, MAX_REF_AUDIO_SECONDS x 16000]."""

    request_id: str
    cache_epoch: int
    chunk_seq: int
    codes: np.ndarray = array_field(np.int32, -1)  # [num_left_context + num_new]
    num_left_context: int = 3
    last_chunk: bool = False
    action: str = ACTION_RUN
    ref_audio: np.ndarray = array_field(np.float32, -1, optional=True)  # [n] float32 16 kHz mono, empty = default voice


@dataclass(frozen=True, slots=True)
class Code2WavAudio:
    """Audio of one window at 24 kHz."""

    request_id: str
    chunk_seq: int
    audio: np.ndarray = array_field(np.float32, -1)  # [samples] 24 kHz mono


def expect_request(request_id: str) -> Code2WavRequest:
    """Code2Wav's announcement that a reply's first window for `request_id` is coming."""
    return Code2WavRequest(request_id=request_id, cache_epoch=0, chunk_seq=0,
                           codes=np.zeros((0,), dtype=np.int32), action=ACTION_EXPECT)


def stop_request(stage: str, request_id: str) -> ThinkerRequest | TalkerRequest | Code2WavRequest:
    """The explicit stop message of a stage (`stage` is the model name)."""
    no_i32 = np.zeros((0,), dtype=np.int32)
    if stage == "thinker":
        return ThinkerRequest(request_id=request_id, audio=np.zeros((0,), np.float32), action=ACTION_STOP)
    if stage == "talker":
        return TalkerRequest(request_id=request_id, condition_seq=0, token_ids=no_i32,
                             hidden=np.zeros((0, 0), np.float32), action=ACTION_STOP)
    if stage == "code2wav":
        return Code2WavRequest(request_id=request_id, cache_epoch=0, chunk_seq=0, codes=no_i32, action=ACTION_STOP)
    raise ValueError(f"unknown stage {stage!r}")
