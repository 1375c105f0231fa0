"""The health probe of the `duplex` orchestrator: one request over the path clients take.

Triton 2.51 keeps `duplex` READY after its stub process died while every session fails
("Stub process 'duplex_0_0' is not healthy"), so readiness asks the model itself: one gRPC
stream request to `duplex` with sequence START and END together, a fresh correlation id
("health-<hex>") and the request parameter `HEALTH_PARAMETER`. A live `duplex` answers it with
an empty FINAL and touches no session (backends/serving/triton_duplex.py, `is_health_probe`);
a dead stub fails it. END on the START request frees the sequence slot at once, so probes take
nothing from the sessions' slots. A probe answer carries no output: an event instead (a
`duplex` that does not know the probe refuses it as a session START) fails the probe.

A request is a probe only in exactly that form (START|END, no input tensor, no other
parameter); anything else that carries the mark goes to the session manager like any request
and is refused there for its unknown parameter.
"""
from __future__ import annotations

import queue
import time
import uuid
from typing import Any

import tritonclient.grpc as grpcclient

from client.stream_close import half_close

HEALTH_PARAMETER = "duplex_health_probe"
PROBE_ID_PREFIX = "health-"
DUPLEX_MODEL = "duplex"
# A probe answer comes at once; a stream still open this long after its half-close is cancelled.
CLOSE_WAIT_S = 1.0


def probe_id() -> str:
    """A correlation id no session holds: a probe must never join a session's sequence."""
    return f"{PROBE_ID_PREFIX}{uuid.uuid4().hex}"


def ask_duplex(grpc_url: str, timeout_s: float, model: str = DUPLEX_MODEL) -> str | None:
    """None when `model` answers a health probe within `timeout_s`; else why it did not."""
    client = None
    try:
        client = grpcclient.InferenceServerClient(grpc_url)
        answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(model, [], request_id=uuid.uuid4().hex, sequence_id=probe_id(),
                                  sequence_start=True, sequence_end=True, enable_empty_final_response=True,
                                  parameters={HEALTH_PARAMETER: True})
        return _until_final(answers, time.monotonic() + timeout_s, timeout_s)
    except Exception as exc:  # the client refused the address or the request
        return f"{type(exc).__name__}: {exc}"
    finally:
        if client is not None:
            _close(client)


def _until_final(answers: queue.SimpleQueue, deadline: float, timeout_s: float) -> str | None:
    while True:
        try:
            result, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return f"no answer to the health probe for {timeout_s:.0f} s"
        if error is not None:
            return str(error.message())
        if result.get_response().outputs:  # an event: the model took the probe for a session request
            return f"not a health answer: {_event(result)}"
        if _is_final(result):
            return None


def _event(result: Any) -> str:
    event = result.as_numpy("EVENT")
    return "outputs without EVENT" if event is None or not event.size else bytes(event.flat[0]).decode(errors="replace")


def _is_final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _close(client: Any) -> None:
    try:
        half_close(client, CLOSE_WAIT_S)
        client.close()
    except Exception:  # a broken channel: nothing more to free
        pass
