"""perf_analyzer `--input-data` JSON for the stage models and the `duplex` model.

Stage requests are built as contract dataclasses (backends/contracts/messages.py) and encoded by
the same `to_arrays` the orchestrator uses, so the data cannot drift from the contracts.

Stage models keep per-request state (a resumable request id with increasing `seq` /
`condition_seq` / `chunk_seq`), so one data file is one scripted session replayed in order:
a `stop`, its requests, then a `stop` that frees the state, so the file can loop. perf_analyzer keeps
the order at concurrency 1; parallel sessions are parallel perf_analyzer processes, each with
its own file (`session` picks distinct request ids).

`duplex` is a sequence model: its data is `{"data": [[step, step, ...]]}`, one stream of
200 ms AUDIO appends per sequence; perf_analyzer adds START/END and the sequence id. Request
parameters cannot differ per step in perf_analyzer (and `duplex` accepts session parameters on
START only), so instead of `initial_user_text` the stream opens with a speech-like clip (a
bundled voice) followed by silence: user speech then a pause is where the policy answers.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from backends.audio.codec_windows import CodecWindowBridge
from backends.contracts.messages import (
    ACTION_STOP, Code2WavRequest, TalkerRequest, ThinkerRequest, stop_request,
)
from backends.contracts.tensor_codec import tensor_specs, to_arrays

UNIT_SAMPLES = 16000
CODEC_VOCAB = 6561  # speech codes 0..6560 (the EOS 6561 never reaches Code2Wav)
FRAMES_PER_UNIT = 25
STAGES = ("thinker", "talker", "code2wav")
STOP_BYTES = list(ACTION_STOP.encode())  # ACTION "stop" as data files and exports hold it: UTF-8 bytes


@dataclasses.dataclass(frozen=True, slots=True)
class StageDims:
    llm_hidden: int  # width of the Thinker hidden rows the Talker is conditioned on
    text_ids: tuple[int, ...]  # ordinary text token ids of the Thinker tokenizer
    turn_eos: int

    @staticmethod
    def for_checkpoint(spec: str) -> "StageDims":
        """Dimensions of `tiny`, `full-random` or a checkpoint directory."""
        from backends.stages.factory import StageSetup

        ckpt = StageSetup.from_params({"checkpoint": spec}).load()
        ids = tuple(ckpt.tokenizer.encode("The weather is lovely today, shall we walk?"))
        return StageDims(ckpt.config.llm.hidden_size, ids, ckpt.special_tokens.turn_eos)


def session_request_id(model: str, session: int) -> str:
    """The request id of scripted session `session` of a stage (pa_run stops it at the end)."""
    return f"pa-{model}-{session}"


def pa_request(request: Any) -> dict[str, Any]:
    """One request as perf_analyzer JSON: required tensors always, optional ones when set."""
    arrays = to_arrays(request)
    out = {}
    for spec in tensor_specs(type(request)):
        array = arrays[spec.name]
        if spec.optional and _is_default(request, spec.field):
            continue
        out[spec.name] = _pa_tensor(array)
    return out


def thinker_session(session: int, units: int, reply_units: int, tokens_per_unit: int) -> list[Any]:
    """Unit 0 opens with text and the forced reply shape; then one 1-second unit per request."""
    rid = session_request_id("thinker", session)
    silence = np.zeros(UNIT_SAMPLES, np.float32)  # [16000] float32
    first = ThinkerRequest(request_id=rid, audio=silence, seq=0,
                           initial_user_text="Please tell me about the weather today.",
                           reply_units=reply_units, reply_tokens_per_unit=tokens_per_unit)
    rest = [ThinkerRequest(request_id=rid, audio=silence, seq=seq) for seq in range(1, units)]
    return [first, *rest, stop_request("thinker", rid)]


def talker_session(session: int, units: int, dims: StageDims, seed: int = 0) -> list[Any]:
    """`units` speak-unit conditions of 4 text tokens + hidden rows; the last ends the turn."""
    rid = session_request_id("talker", session)
    rng = np.random.default_rng(seed)
    requests = []
    for seq in range(units):
        tokens = list(dims.text_ids[4 * seq % len(dims.text_ids):][:4]) or list(dims.text_ids[:4])
        turn_end = seq == units - 1
        tokens += [dims.turn_eos] if turn_end else []
        hidden = rng.standard_normal((len(tokens), dims.llm_hidden)).astype(np.float32)  # [m, llm_hidden]
        requests.append(TalkerRequest(request_id=rid, condition_seq=seq, token_ids=np.asarray(tokens, np.int32),
                                      hidden=hidden, turn_start=seq == 0, turn_end=turn_end))
    return [*requests, stop_request("talker", rid)]


def code2wav_session(session: int, units: int, seed: int = 0) -> list[Any]:
    """The windows CodecWindowBridge cuts from `units` x 25 random codes, turn end included."""
    rid = session_request_id("code2wav", session)
    codes = np.random.default_rng(seed).integers(0, CODEC_VOCAB, units * FRAMES_PER_UNIT).tolist()
    bridge = CodecWindowBridge()
    windows = bridge.push(codes) + bridge.end_turn()
    requests = [Code2WavRequest(request_id=rid, cache_epoch=w.cache_epoch, chunk_seq=w.chunk_seq,
                                codes=np.asarray(w.codes, np.int32), num_left_context=w.num_left_context,
                                last_chunk=w.last_chunk) for w in windows]
    return [*requests, stop_request("code2wav", rid)]


def duplex_stream(speech: np.ndarray, seconds: float, append_ms: int = 200) -> list[dict[str, Any]]:
    """Steps of one duplex sequence: `speech` ([n] int16 16 kHz), then silence up to `seconds`."""
    step = UNIT_SAMPLES * append_ms // 1000
    total = max(int(seconds * UNIT_SAMPLES), speech.size)
    audio = np.zeros(-(-total // step) * step, np.int16)  # [k * step] int16
    audio[: speech.size] = speech
    return [{"AUDIO": _pa_tensor(audio[i: i + step])} for i in range(0, audio.size, step)]


def stage_data(model: str, session: int, units: int, dims: StageDims | None, reply_units: int = 4,
               tokens_per_unit: int = 4) -> dict[str, Any]:
    """One scripted session, opened by a `stop` of its request id as well as closed by one: a
    run cut short mid-session (perf_analyzer ends wherever its window ends) leaves the id
    started, and the next run's opening stop clears it instead of failing on `already started`."""
    if model not in STAGES:
        raise ValueError(f"model must be one of {STAGES}, got {model!r}")
    requests = [stop_request(model, session_request_id(model, session)), *_session(model, session, units, dims,
                                                                                   reply_units, tokens_per_unit)]
    return {"data": [pa_request(r) for r in requests]}


def _session(model: str, session: int, units: int, dims: StageDims | None, reply_units: int,
             tokens_per_unit: int) -> list[Any]:
    if model == "thinker":
        requests = thinker_session(session, units, reply_units, tokens_per_unit)
    elif model == "talker":
        requests = talker_session(session, units, _need(dims), seed=session)
    else:
        requests = code2wav_session(session, units, seed=session)
    return requests


def duplex_data(speech: np.ndarray, seconds: float, num_sequences: int, append_ms: int = 200) -> dict[str, Any]:
    return {"data": [duplex_stream(speech, seconds, append_ms) for _ in range(num_sequences)]}


def is_stop(request: dict[str, Any]) -> bool:
    return request.get("ACTION", {}).get("content") == STOP_BYTES


def _need(dims: StageDims | None) -> StageDims:
    if dims is None:
        raise ValueError("talker data needs StageDims (the Thinker hidden width and token ids)")
    return dims


def _is_default(request: Any, name: str) -> bool:
    field = next(f for f in dataclasses.fields(request) if f.name == name)
    value = getattr(request, name)
    if isinstance(value, np.ndarray):
        return value.size == 0
    return field.default is not dataclasses.MISSING and value == field.default


def _pa_tensor(array: np.ndarray) -> dict[str, Any]:
    if array.dtype == np.object_:
        content = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    else:
        content = array.reshape(-1).tolist()
    return {"content": content, "shape": list(array.shape)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, choices=(*STAGES, "duplex"))
    parser.add_argument("--checkpoint", default="tiny", help="tiny | full-random | a directory (talker dims)")
    parser.add_argument("--units", type=int, default=5, help="units per scripted stage session")
    parser.add_argument("--session", type=int, default=0, help="request-id suffix (one per parallel process)")
    parser.add_argument("--seconds", type=float, default=8.0, help="duplex: audio per sequence")
    parser.add_argument("--sequences", type=int, default=1, help="duplex: streams in the file")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.model == "duplex":
        from perf.workload import load_voices

        voices = load_voices()
        data = duplex_data(voices[sorted(voices)[0]], args.seconds, args.sequences)
    else:
        dims = StageDims.for_checkpoint(args.checkpoint) if args.model == "talker" else None
        data = stage_data(args.model, args.session, args.units, dims)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
