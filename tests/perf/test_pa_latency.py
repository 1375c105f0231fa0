"""perf/pa_latency.py on hand-written perf_analyzer exports: first / inter-response times
count the responses that carry outputs (a stage's last result rides on its FINAL; an older
empty FINAL is no data, and neither is the leftover-filled one perf_analyzer 2.51 exports),
FINAL-only requests and stops are acks, duplex events give TTFP and gaps."""
from __future__ import annotations

import json

import pytest

from perf.pa_inputs import STOP_BYTES
from perf.pa_latency import duplex_latency, load_requests, stream_latency

MS = 1_000_000  # ns
EXACT = 1e-9


def request(sent_ms, responses_ms, outputs=None, inputs=None):
    return {"timestamp": sent_ms * MS, "request_inputs": inputs or {},
            "response_timestamps": [t * MS for t in responses_ms],
            "response_outputs": outputs or [{} for _ in responses_ms]}


DATA = {"AUDIO": [0.0]}


def test_stream_latency_counts_the_responses_with_outputs_and_the_acks():
    requests = [request(0, [10, 30, 35], [DATA, DATA, {}]),  # data, then an empty FINAL
                request(100, [120, 121], [DATA, DATA]),  # the last result on the FINAL
                request(200, [201], [{}])]  # a stop: the FINAL alone
    result = stream_latency(requests)
    assert (result.requests, result.acks) == (2, 1)
    assert result.first_response_ms.mean == pytest.approx(15.0, abs=EXACT)  # 10 and 20
    assert result.inter_response_ms.count == 2
    assert result.inter_response_ms.mean == pytest.approx(10.5, abs=EXACT)  # 20 and 1
    assert result.last_response_ms.max == pytest.approx(30.0, abs=EXACT)


RID = [112, 97, 45, 48]  # "pa-0" as the UINT8 values perf_analyzer exports


def test_a_stage_response_is_data_only_when_it_names_its_request():
    """What perf_analyzer 2.51 exported for a Thinker run: a stop's empty FINAL comes with every
    output name, holding leftover bytes; only the unit results carry the request's id."""
    unit = {"REQUEST_ID": RID, "SEQ": 1, "TTS_HIDDEN": [0.5, -1.0]}
    leftover = {"REQUEST_ID": 132, "SEQ": 140204379839237, "TTS_HIDDEN": 1.65e-24}
    requests = [request(0, [20], [unit], {"REQUEST_ID": RID}),
                request(20, [21], [leftover], {"REQUEST_ID": RID, "ACTION": STOP_BYTES}),
                request(30, [40, 45], [unit, leftover], {"REQUEST_ID": RID})]  # a result, then an empty FINAL
    result = stream_latency(requests)
    assert (result.requests, result.acks) == (2, 1)
    assert result.first_response_ms.mean == pytest.approx(15.0, abs=EXACT)  # 20 and 10
    assert result.inter_response_ms.count == 0


def test_a_stop_is_an_ack_in_a_text_scanned_export(tmp_path):
    """Unreadable JSON keeps the timestamps and each request's ACTION: the stop stays an ack."""
    unit = request(0, [20], [{"REQUEST_ID": RID}], {"REQUEST_ID": RID})
    stop = request(20, [21], [{"REQUEST_ID": 7}], {"REQUEST_ID": RID, "ACTION": STOP_BYTES})
    text = json.dumps({"experiments": [{"requests": [unit, stop, unit]}]}) + '{"broken'
    export = tmp_path / "export.json"
    export.write_text(text)
    loaded = load_requests(export)
    assert [r.get("request_inputs") for r in loaded] == [None, {"ACTION": STOP_BYTES}, None]
    result = stream_latency(loaded)
    assert (result.requests, result.acks) == (2, 1)


def test_duplex_latency_reads_the_downlink_events(tmp_path):
    def event(kind, **fields):
        return {"EVENT": json.dumps({"type": kind, "session_id": "1", **fields})}

    downlink = request(0, [2, 900, 1000, 2000, 2100, 2101], [
        event("session.created"), event("response.text.delta", text="hi"),
        event("response.audio.delta", ttfp_ms=180.0), event("response.audio.delta"),
        event("session.closed"), {"EVENT": "", "AUDIO_OUT": 0}])
    uplinks = [request(200 * k, [200 * k + 1]) for k in range(1, 4)]
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"experiments": [{"requests": [downlink, *uplinks]}]}))
    result = duplex_latency(load_requests(export))
    assert result.sessions == 1
    assert result.session_created_ms.mean == pytest.approx(2.0, abs=EXACT)
    assert result.ttft_ms.mean == pytest.approx(900.0, abs=EXACT)
    assert result.ttfp_ms.mean == pytest.approx(1000.0, abs=EXACT)
    assert result.server_ttfp_ms.mean == pytest.approx(180.0, abs=EXACT)
    assert result.audio_gap_ms.mean == pytest.approx(1000.0, abs=EXACT)
    assert result.uplink_ack_ms.count == 3 and result.uplink_ack_ms.mean == pytest.approx(1.0, abs=EXACT)


def test_an_export_that_is_not_json_still_gives_its_timestamps(tmp_path):
    """perf_analyzer 2.51 wrote an export for Code2Wav's audio outputs that json cannot read
    (on an H200); the timestamps are still there and, every response counting as data, give
    the latencies of requests that all answered with data."""
    requests = [request(0, [10, 30, 35], [DATA] * 3), request(100, [120, 121], [DATA] * 2)]
    good = {"experiments": [{"requests": requests}]}
    text = json.dumps(good).replace('"response_outputs": [{"AUDIO": [0.0]}, {"AUDIO": [0.0]}, {"AUDIO": [0.0]}]',
                                    '"response_outputs": [{"AUDIO": "\x01"bad"}]', 1)
    broken = tmp_path / "export.json"
    broken.write_text(text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    loaded = load_requests(broken)
    assert [(r["timestamp"], r["response_timestamps"]) for r in loaded] == [
        (r["timestamp"], r["response_timestamps"]) for r in requests
    ]
    assert stream_latency(loaded) == stream_latency(requests)
