"""The middle step of the `audio_tail` ensemble (ensemble/README.md): Talker codec groups in,
Code2Wav windows out, one utterance per Talker condition.

Triton ensembles forbid a step whose inputs come from different decoupled models, so this step
sees only the Talker's own outputs (`TalkerCodes`: request id, condition seq, codes, finished),
never the original request's `turn_end`. It therefore treats every finished condition as the
end of the utterance: the codes are cut by the same `CodecWindowBridge` the duplex
orchestrator uses, the finished group flushes with `last_chunk`, and the caller stops the
Talker request (its KV is reserved until stopped). A request id that comes back (perf_analyzer
cycles through a fixed set) continues under the next `cache_epoch`, as Code2Wav requires.
Triton-free; `ensemble/codec_bridge/1/model.py` wraps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.audio.codec_windows import CodecWindowBridge
from backends.contracts.messages import Code2WavRequest, TalkerCodes
from backends.stages.code2wav_engine import request_from_window

# Bridges of ids not seen for this many other ids are dropped (their epoch counter restarts;
# Code2Wav has released those ids by then, as each utterance ends with its last window).
MAX_REMEMBERED_IDS = 4096


@dataclass(frozen=True, slots=True)
class BridgeOutput:
    windows: list[Code2WavRequest]  # in chunk_seq order
    utterance_ended: bool  # the condition finished: stop the Talker request now


@dataclass(slots=True)
class CodecBridge:
    _bridges: dict[str, CodecWindowBridge] = field(default_factory=dict)

    def on_codes(self, group: TalkerCodes) -> BridgeOutput:
        bridge = self._bridges.pop(group.request_id, None) or CodecWindowBridge()
        self._bridges[group.request_id] = bridge  # most recent last
        windows = bridge.push([int(code) for code in group.codes])
        if group.finished:
            windows += bridge.end_turn()  # opens the next epoch for a returning id
        while len(self._bridges) > MAX_REMEMBERED_IDS:
            del self._bridges[next(iter(self._bridges))]
        requests = [request_from_window(group.request_id, window) for window in windows]
        return BridgeOutput(requests, group.finished)

    def num_requests(self) -> int:
        return len(self._bridges)
