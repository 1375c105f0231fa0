"""The audio tail of one session: speak unit -> Talker frames -> codec windows -> audio deltas.

Runs on the session's audio thread. One Talker request and one Code2Wav stream per epoch;
each response (model turn) is one Code2Wav cache epoch, closed by the turn-end flush. The first
window of every cache epoch carries the session's START REF_AUDIO (16 kHz, the rate Code2Wav's
voice prompt takes), so each of its streams speaks in that voice (none: the default voice). This
thread is the only sender of both, so after voicing a unit whose epoch ended meanwhile it stops
the two requests itself: a barge-in stop may have overtaken a condition or window that would
otherwise restart them (docs/architecture.md edge cases 1 and 7).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from backends.audio.codec_windows import CodecWindow, CodecWindowBridge
from backends.contracts.errors import StageError
from backends.contracts.messages import Code2WavRequest, TalkerRequest
from backends.contracts.stage_clients import CODE2WAV, TALKER, StageCallError, StageClients
from backends.duplex import events as ev
from backends.duplex.errors import STAGE_FAILED
from backends.duplex.responses import SpeakWork, to_pcm16

if TYPE_CHECKING:
    from backends.duplex.session import Session

log = logging.getLogger(__name__)


class AudioTail:
    def __init__(self, session: "Session", stages: StageClients) -> None:
        self._session = session
        self._stages = stages
        self._bridge = CodecWindowBridge()
        self._bridge_epoch = -1  # session epoch the bridge belongs to

    def voice(self, work: SpeakWork) -> bool:
        """Voice one speak unit; False when the session must stop (the error is reported)."""
        if not self._session.options.tts_enabled:  # text only: no stage request, the text was sent
            self._end_text_only(work)
            return True
        try:
            self._voice(work)
        except StageCallError as exc:
            with self._session.lock():
                stale = not self._session.is_current(work.epoch)
            if not stale:
                self._session.close("error", exc.error)
                return False
        finally:
            self._session.stop_if_stale(work.epoch, self._request_id(work.epoch), (TALKER, CODE2WAV))
        return True

    def _request_id(self, epoch: int) -> str:
        return f"{self._session.session_id}.e{epoch}"

    def _voice(self, work: SpeakWork) -> None:
        request = self._talker_request(work)
        if request is None:
            return
        if work.turn_start:  # the reply's first window comes out of this Talker call
            self._expect_first_window(work.epoch)
        finished = False
        for group in self._stages.talker(request):
            finished = finished or group.finished
            for window in self._bridge.push([int(c) for c in group.codes]):
                self._vocode(work, window)
        if not finished:  # a stop or a failure after its first frames (triton_responses.py)
            raise StageCallError(TALKER, StageError(STAGE_FAILED, f"talker request {request.request_id!r} condition "
                                                    f"{request.condition_seq} ended before its last frames"))
        windows = self._bridge.end_turn() if work.turn_end else self._bridge.end_unit()
        for window in windows:
            self._vocode(work, window)
        if work.turn_end:
            with self._session.lock():
                if self._session.is_current(work.epoch):
                    self._session.finish_response(work.response, ev.STATUS_COMPLETED)

    def _end_text_only(self, work: SpeakWork) -> None:
        with self._session.lock():
            if work.turn_end and self._session.is_current(work.epoch):
                self._session.finish_response(work.response, ev.STATUS_COMPLETED)

    def _expect_first_window(self, epoch: int) -> None:
        request_id = self._request_id(epoch)
        try:
            self._stages.expect_window(request_id)
        except Exception as exc:  # only a hint: the reply goes on without it
            log.warning("announcing the first window of %s failed: %r", request_id, exc)

    def _talker_request(self, work: SpeakWork) -> TalkerRequest | None:
        session = self._session
        with session.lock():
            if not session.is_current(work.epoch):
                return None
            ids = session.current_ids()
            if self._bridge_epoch != work.epoch:
                self._bridge, self._bridge_epoch = CodecWindowBridge(), work.epoch
            ids.started.update((TALKER, CODE2WAV))
            work.response.pending_text += work.text
            seq, ids.next_condition_seq = ids.next_condition_seq, ids.next_condition_seq + 1
            return TalkerRequest(
                request_id=ids.request_id, condition_seq=seq, token_ids=work.token_ids, hidden=work.hidden,
                turn_start=work.turn_start, turn_end=work.turn_end, seed=session.options.seed + 42,
            )

    def _vocode(self, work: SpeakWork, window: CodecWindow) -> None:
        with self._session.lock():
            if not self._session.is_current(work.epoch):  # barge-in: no new codec state for it
                return
        request = Code2WavRequest(
            request_id=self._request_id(work.epoch), cache_epoch=window.cache_epoch,
            chunk_seq=window.chunk_seq, codes=np.asarray(window.codes, dtype=np.int32),
            num_left_context=window.num_left_context, last_chunk=window.last_chunk,
            ref_audio=self._reference(window),
        )
        for chunk in self._stages.code2wav(request):
            if chunk.audio.size:
                self._emit_audio(work, chunk.audio)

    def _reference(self, window: CodecWindow) -> np.ndarray:
        """The session's reference voice on a cache epoch's first window, else empty."""
        ref = self._session.options.ref_audio
        return ref if window.chunk_seq == 0 and ref is not None else np.zeros((0,), np.float32)

    def _emit_audio(self, work: SpeakWork, audio: np.ndarray) -> None:
        session = self._session
        with session.lock():
            if not session.is_current(work.epoch) or work.response.done:
                return
            response = work.response
            fields: dict[str, object] = {"response_id": response.response_id, "turn_id": response.turn_id}
            if response.audio_samples == 0:
                fields["ttfp_ms"] = round(1000.0 * (session.clock() - response.trigger_time), 1)
            response.audio_samples += int(audio.size)
            fields.update(text=response.pending_text, audio_ms=round(response.audio_ms, 1))
            response.pending_text = ""
            session.emit(ev.RESPONSE_AUDIO_DELTA, audio=to_pcm16(audio), **fields)

