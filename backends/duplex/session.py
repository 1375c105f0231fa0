"""One duplex session: its uplink units, the Thinker loop, the audio-tail loop, its events.

Two worker threads per session: the Thinker loop turns each 1-second unit into a listen/speak
decision; the audio-tail loop turns speak units into codec frames (Talker) and 24 kHz audio
(Code2Wav). They meet in a queue, so the Thinker decides unit k+1 while unit k is voiced.
Every emission is fenced by the epoch: after a barge-in (`cancel`) or a close, nothing of the
old epoch reaches the client. `force_finish` (the audio loop's exit) runs once and is the only
place that sends `session.closed` and the downlink FINAL.

Stage requests of an old epoch are stopped when the epoch ends (StageStops), and again by the loop
that called a stage if its epoch went stale meanwhile: that stop may have overtaken the call
(docs/architecture.md edge case 1), and each loop is the only sender of its stages' requests. A
close aborts once; a loop stuck in a stage call shows in `stall` (the reaper acts on both).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

import numpy as np

from backends.contracts.errors import StageError
from backends.contracts.messages import DECISION_SPEAK, ThinkerUnitResult
from backends.contracts.stage_clients import StageClients
from backends.duplex import close_reasons as why
from backends.duplex import events as ev
from backends.duplex.audio_tail import AudioTail
from backends.duplex.downlink import Downlink
from backends.duplex.responses import EpochIds, ResponseState, SpeakWork, UnitWork
from backends.duplex.stage_stops import StageStops
from backends.duplex.stall_watch import StallWatch, WatchedStages
from backends.duplex.thinker_call import call_thinker
from backends.duplex.unit_queue import SessionConfig, setup_request, thinker_request
from backends.duplex.uplink import SessionOptions
from backends.duplex.uplink_intake import UplinkIntake

log = logging.getLogger(__name__)


class Session:
    def __init__(self, session_id: str, options: SessionOptions, downlink: Downlink, stages: StageClients,
                 config: SessionConfig, on_finished: Callable[["Session"], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session_id = session_id
        self.options = options
        self.stall = StallWatch(clock)
        self.downlink, self._stages, self._config = downlink, WatchedStages(stages, self.stall), config
        self._stops = StageStops(stages)
        self._on_finished, self._clock = on_finished, clock
        self._lock = threading.Lock()  # guards every field below; held only for state, never for I/O
        self._ids = EpochIds(session_id, 0)
        self.intake = UplinkIntake(config, clock)  # the uplink audio the Thinker has not taken
        self._units = self.intake.units
        self.sequence_open = True  # no END (the client's or our own) has ended Triton's sequence
        self._speak: queue.SimpleQueue[SpeakWork | None] = queue.SimpleQueue()
        self._open: dict[str, ResponseState] = {}  # response_id -> response not yet done
        self._thinker_response: ResponseState | None = None  # the response new speak units join
        self._turn_counter, self._units_in_epoch = 0, 0
        self._closing, self._close_reason = False, why.CLIENT
        self.aborted_at: float | None = None  # clock() of the close that aborted the session
        self._finished = False
        self.last_activity = clock()
        self._tail = AudioTail(self, self._stages)
        self._threads = [threading.Thread(target=self._thinker_loop, name=f"thinker-{session_id}", daemon=True),
                         threading.Thread(target=self._audio_loop, name=f"audio-{session_id}", daemon=True)]

    # ---- uplink (called from the server's execute thread) -------------------------------

    def start(self) -> None:
        self.emit(ev.SESSION_CREATED, epoch=0)
        for thread in self._threads:
            thread.start()

    def append(self, pcm16: np.ndarray, commit: bool = False) -> None:
        """Queue the audio's whole units; past the uplink bound, raise DuplexError instead."""
        with self._lock:
            self.last_activity = self._clock()
            if self._closing:
                return
            for samples in self.intake.cut(pcm16, commit):
                self._units.put(UnitWork(self._ids.epoch, samples, self.last_activity, self._force_listen()))

    def _force_listen(self) -> bool:
        self._units_in_epoch += 1
        return self._units_in_epoch <= self.options.force_listen_count

    def cancel(self) -> None:
        """Barge-in: end the active response as cancelled and start a new epoch."""
        with self._lock:
            self.last_activity = self._clock()
            if self._closing:
                return
            old = self._new_epoch()
        self._stop_stage_requests(old)
        self._units.clear()  # the old epoch's units: never decided, no longer held
        self._units.wake()  # the new epoch's setup goes out before its first unit

    def end(self) -> None:
        """END: finish the queued units and their audio, then close."""
        with self._lock:
            self.sequence_open = False  # Triton ended the sequence with the END request
            self.last_activity = self._clock()
            if self._closing:
                return
            self._closing = True
        self._units.put(None)

    def close(self, reason: str, error: StageError | None = None) -> None:
        """Close now (idle, client gone, error, shutdown): drop queued work, stop stage requests."""
        if reason == why.SHUTDOWN:
            self._stops.disable()
        with self._lock:
            if self._finished or self.aborted_at is not None:
                return
            self.aborted_at = self._clock()
            if not self._closing:
                self._close_reason = reason
            self._closing = True
            if error is not None:
                self.emit(ev.ERROR, code=error.code, message=error.message)
            old = self._new_epoch(status=ev.STATUS_FAILED if error else ev.STATUS_CANCELLED, reason=reason)
            self.intake.drop()  # frees the audio now, END's sentinel included
        self._stop_stage_requests(old)
        self._units.put(None)

    # ---- state changes (lock held) ---------------------------------------------------------

    def _new_epoch(self, status: str = ev.STATUS_CANCELLED, reason: str = "cancelled") -> EpochIds:
        for response in list(self._open.values()):
            self._finish_response(response, status, reason=reason)
        self._thinker_response = None
        old, self._ids = self._ids, EpochIds(self.session_id, self._ids.epoch + 1)
        self._units_in_epoch = 0
        return old

    def _finish_response(self, response: ResponseState, status: str, **fields: object) -> None:
        if response.done:
            return
        response.done = True
        self._open.pop(response.response_id, None)
        if self._thinker_response is response:
            self._thinker_response = None
        self.emit(ev.RESPONSE_DONE, response_id=response.response_id, turn_id=response.turn_id, status=status,
                  audio_ms=round(response.audio_ms, 1), **fields)

    def emit(self, event_type: str, audio: np.ndarray | None = None, **fields: object) -> None:
        self.downlink.send(ev.ServerEvent(event_type, self.session_id, dict(fields), audio))

    def is_current(self, epoch: int) -> bool:
        return epoch == self._ids.epoch and not self._finished

    @property
    def is_closing(self) -> bool:
        return self._closing  # a bool read: no lock needed for the reaper's check

    def live_threads(self) -> int:
        return sum(thread.is_alive() for thread in self._threads)

    def client_gone(self) -> bool:
        """Whether the client cancelled the downlink stream (closed it or disconnected)."""
        try:
            return bool(self.downlink.is_cancelled())
        except Exception as exc:  # a sender already closed cannot tell; the session ends anyway
            log.debug("cancellation check of %s failed: %r", self.session_id, exc)
            return False

    def stop_if_stale(self, epoch: int, request_id: str, stages: tuple[str, ...]) -> None:
        """After a stage call of `epoch`: stop its request if the epoch ended meanwhile."""
        with self._lock:
            stale = not self.is_current(epoch)
        if stale:
            self._stops.stop(request_id, stages)

    # ---- Thinker loop ------------------------------------------------------------------------

    def _thinker_loop(self) -> None:
        try:
            while self._set_up_epoch() and (batch := self._units.next_batch()) is not None:
                with self._lock:
                    batch = [w for w in batch if self.is_current(w.epoch)]
                if batch and not self._run_thinker(batch):
                    break
        except Exception as exc:  # a bug here must still close the session cleanly
            log.exception("thinker loop of %s failed", self.session_id)
            self.close(why.ERROR, StageError("internal", f"{type(exc).__name__}: {exc}"))
        finally:
            self._speak.put(None)

    def _set_up_epoch(self) -> bool:
        """An epoch's seq 0 goes out alone, before its first unit: the Thinker prefills the
        context while the user speaks. Not when closing (queued units carry the setup)."""
        with self._lock:
            ids = self._ids
            if ids.next_seq or self._closing:
                return True
            request = setup_request(ids, self.options)
        return call_thinker(self, self._stages.thinker, ids.epoch, request, None)

    def _run_thinker(self, batch: list[UnitWork]) -> bool:
        with self._lock:
            ids, epoch = self._ids, batch[0].epoch
            if not self.is_current(epoch):  # a barge-in since `_drain_batch`
                return True
            request = thinker_request(ids, batch, self.options)
        # A multi-unit append is decided once, on its last unit (the Thinker's contract).
        return call_thinker(self, self._stages.thinker, epoch, request,
                            lambda result: self._on_unit(epoch, batch[-1], result))

    def _on_unit(self, epoch: int, work: UnitWork, result: ThinkerUnitResult) -> None:
        with self._lock:
            if not self.is_current(epoch):
                return
            if result.decision != DECISION_SPEAK:
                self.emit(ev.RESPONSE_LISTEN, unit_index=result.unit_index)
                return
            response = self._response_for(work)
            turn_start = response.units == 0
            response.units += 1
            if result.text:
                self._emit_text(response, result)
            self._speak.put(SpeakWork(epoch, response, result.tts_token_ids, result.tts_hidden, result.text,
                                      turn_start, result.turn_end))
            if result.turn_end:
                self._thinker_response = None

    def _response_for(self, work: UnitWork) -> ResponseState:
        if self._thinker_response is None:
            response = ResponseState.new(self.session_id, self._ids.epoch, self._turn_counter, work.accepted)
            self._turn_counter += 1
            self._thinker_response = self._open[response.response_id] = response
            self.emit(ev.RESPONSE_CREATED, response_id=response.response_id, turn_id=response.turn_id)
            self.emit(ev.RESPONSE_SPEAK, response_id=response.response_id, turn_id=response.turn_id)
        return self._thinker_response

    def _emit_text(self, response: ResponseState, result: ThinkerUnitResult) -> None:
        fields: dict[str, object] = {}
        if response.first_text_time is None:
            response.first_text_time = self._clock()
            fields["ttft_ms"] = round(1000.0 * (response.first_text_time - response.trigger_time), 1)
        self.emit(ev.RESPONSE_TEXT_DELTA, response_id=response.response_id, turn_id=response.turn_id,
                  unit_index=result.unit_index, text=result.text, n_tokens=int(result.token_ids.size), **fields)

    # ---- audio-tail loop ---------------------------------------------------------------------

    def _audio_loop(self) -> None:
        try:
            while (work := self._speak.get()) is not None:
                with self._lock:
                    current = self.is_current(work.epoch)
                if current and not self._tail.voice(work):
                    break
        except Exception as exc:
            log.exception("audio loop of %s failed", self.session_id)
            self.close(why.ERROR, StageError("internal", f"{type(exc).__name__}: {exc}"))
        finally:
            self._finish()

    def lock(self) -> threading.Lock:
        return self._lock

    def clock(self) -> float:
        return self._clock()

    def current_ids(self) -> EpochIds:
        return self._ids

    def finish_response(self, response: ResponseState, status: str) -> None:
        self._finish_response(response, status)

    # ---- teardown ------------------------------------------------------------------------------

    def _stop_stage_requests(self, ids: EpochIds) -> None:
        self._stops.stop(ids.request_id)

    def _finish(self) -> None:
        # Drain the Thinker loop first: it may still be inside a stage call of this session.
        if threading.current_thread() is not self._threads[0]:
            self._threads[0].join()
        self.force_finish()

    def force_finish(self) -> None:
        """Send session.closed and the FINAL, free the transport, forget the session: once."""
        with self._lock:
            if self._finished:
                return
            old = self._new_epoch(reason="session_closed")
            self._finished = True
            self.emit(ev.SESSION_CLOSED, reason=self._close_reason)
        self._stop_stage_requests(old)
        self.downlink.close()
        if why.frees_transport(self._close_reason) and self.sequence_open:
            self.sequence_open = False  # before the END goes out: a START meanwhile is refused alone
            try:
                self.downlink.abandon()
            except Exception as exc:  # the slot then waits for Triton's own idle timer
                log.warning("releasing the sequence of %s failed: %r", self.session_id, exc)
        self._on_finished(self)
