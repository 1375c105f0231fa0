"""The soak's stub pauser (perf/soak_pauser.py) and the stub lookup it uses
(perf/soak_processes.py) on a stand-in stub: a child process of this test started through a link
named like the Python-backend stub binary, with a model.py as its first argument."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from perf.soak_pauser import StubPauser
from perf.soak_processes import stub_models, stub_of


@pytest.fixture
def stand_in(tmp_path: Path):
    model = tmp_path / "repo" / "talker" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text("import time\ntime.sleep(60)\n")
    stub = tmp_path / "triton_python_backend_stub"  # the kernel names the process after the link
    stub.symlink_to(Path(sys.executable).resolve())
    child = subprocess.Popen([str(stub), str(model)])
    deadline = time.monotonic() + 10
    while child.pid not in stub_models(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield child
    child.kill()
    child.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_servers_stubs_are_found_with_their_models(stand_in) -> None:
    assert stub_models(os.getpid()) == {stand_in.pid: "talker"}
    assert stub_of(os.getpid(), "talker") == stand_in.pid
    with pytest.raises(LookupError, match="no stub process of thinker"):
        stub_of(os.getpid(), "thinker")


def test_a_paused_stub_stands_still_and_is_continued(stand_in) -> None:
    pauser = StubPauser(every_s=0.6, pause_s=0.4)
    pauser.server_pid = os.getpid
    stop = threading.Event()
    thread = threading.Thread(target=pauser.run, args=(stop,))
    thread.start()
    deadline = time.monotonic() + 5
    while _state(stand_in.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _state(stand_in.pid) == "T", "the stub was never stopped"
    stop.set()  # the soak ends during the pause: the stub must still be continued
    thread.join(5)
    assert _state(stand_in.pid) != "T"
    assert pauser.tally.to_json() == {"pauses": 1, "by_model": {"talker": 1}, "failures": []}


def test_a_pause_must_fit_its_period() -> None:
    with pytest.raises(ValueError, match="pause"):
        StubPauser(every_s=2.0, pause_s=3.0)
