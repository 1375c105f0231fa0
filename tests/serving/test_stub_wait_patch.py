"""The Python backend's stub hand-off wait patch (backends/serving/stub_wait_patch.py), on the
real library of the pinned nvidia-pytriton wheel; the server-side effect is
tests/server/test_stub_pause.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backends.serving import stub_wait_patch as swp
from backends.serving.triton_install import find_triton

pytriton = pytest.importorskip("pytriton")
WHEEL_BACKEND = Path(pytriton.__file__).parent / "tritonserver" / "backends" / "python"
WHEEL_LIBRARY = WHEEL_BACKEND / "libtriton_python.so"


@pytest.fixture
def library(tmp_path) -> Path:
    copy = tmp_path / "libtriton_python.so"
    shutil.copy2(WHEEL_LIBRARY, copy)
    return copy


def test_the_wheel_library_is_recognised_and_patched_only_inside_the_hand_off(library):
    before = library.read_bytes()
    assert swp.state(library) == "original"
    assert swp.patch(library) is True
    after = library.read_bytes()
    assert swp.state(library) == "patched" and len(after) == len(before)
    changed = [at for at, (old, new) in enumerate(zip(before, after)) if old != new]
    function = swp.function_range(before)
    assert changed and all(function.offset <= at < function.offset + function.size for at in changed)
    assert len(changed) <= 3 * 4 + 8  # four 32-bit immediates' low bytes and one 64-bit one


def test_patching_twice_changes_nothing(library):
    swp.patch(library)
    patched = library.read_bytes()
    assert swp.patch(library) is False and library.read_bytes() == patched
    assert swp.main([str(library), "--check"]) == 0


def test_an_unknown_build_is_refused_and_left_as_it_was(library, tmp_path, capsys):
    stub = tmp_path / "triton_python_backend_stub"
    shutil.copy2(next((WHEEL_BACKEND.parent.parent / "python_backend_stubs").glob("*/triton_python_backend_stub")), stub)
    assert swp.main([str(stub)]) == 2
    assert "no symbol" in capsys.readouterr().err
    image = bytearray(library.read_bytes())
    code = swp.function_range(bytes(image))
    half = bytes(image[code.offset:code.offset + code.size]).replace(swp.FORMS[0].original, swp.FORMS[0].patched, 1)
    image[code.offset:code.offset + code.size] = half
    library.write_bytes(image)
    with pytest.raises(swp.StubWaitPatchError, match="expected"):
        swp.patch(library)
    assert library.read_bytes() == image
    assert swp.main([str(library), "--check"]) == 1


def test_the_backend_the_launcher_publishes_is_patched(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONSERVER_BIN", raising=False)
    if shutil.which("tritonserver"):
        pytest.skip("a tritonserver on PATH is used as installed")
    install = find_triton(tmp_path / "triton")
    assert swp.state(install.backend_dir / "python" / "libtriton_python.so") == "patched"
    assert swp.state(WHEEL_LIBRARY) == "original"  # the wheel itself is left as installed
