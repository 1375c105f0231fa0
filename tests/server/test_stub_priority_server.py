"""The MPS priority wrapper stub on a real server (backends/serving/stub_priority.py): Triton
starts the listed stage's stub through it, that stub process carries CUDA_MPS_CLIENT_PRIORITY=1
from its start, the other stages' stubs do not, and the wrapped stage serves as before."""
from __future__ import annotations

from pathlib import Path

from conftest import RELIABILITY_LOW_PRIORITY
from server_resources import ServerResources
from session_probe import silence_units

from backends.serving.profiles import STAGES

PRIORITY = b"CUDA_MPS_CLIENT_PRIORITY=1"


def _stub_environments(server) -> dict[str, list[bytes]]:
    """stage name -> its stub process's environment entries, found by the model path argument."""
    found = {}
    for pid in ServerResources.take(server).stubs:
        try:
            args = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        for stage in STAGES:
            if any(arg.endswith(f"/{stage}/1/model.py".encode()) for arg in args):
                found[stage] = environ
    return found


def test_only_the_listed_stage_starts_at_low_priority_and_it_still_serves(reliability_server, probes):
    environments = _stub_environments(reliability_server)
    assert set(environments) == set(STAGES), environments.keys()
    for stage, environ in environments.items():
        assert (PRIORITY in environ) == (stage in RELIABILITY_LOW_PRIORITY), stage
    probe = probes()
    probe.start(initial_user_text="Hello.", reply_units=1, reply_tokens_per_unit=2)
    probe.append(silence_units(3))
    assert probe.wait_type("response.audio.delta")["audio_ms"] > 0  # Code2Wav answered
