"""Find a tritonserver binary and prepare what it needs to run Python-backend models.

Two layouts: a `tritonserver` on PATH (the NGC container, backends in /opt/tritonserver), or the
server inside the nvidia-pytriton wheel, whose `backends/python` lacks the stub for our
interpreter and whose libraries need LD_LIBRARY_PATH
(docs/triton_behaviours.md#the-python-stub-and-libpython). The wheel's Python backend is
published with its stub hand-off wait lengthened (backends/serving/stub_wait_patch.py); a
server on PATH is used as installed, with a warning when its backend lacks that change.
"""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from backends.serving.stub_wait_patch import patch as patch_stub_wait
from backends.serving.stub_wait_patch import state as stub_wait_state


@dataclass(frozen=True, slots=True)
class TritonInstall:
    binary: Path
    backend_dir: Path
    library_dirs: tuple[Path, ...]  # prepended to LD_LIBRARY_PATH, in order

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for the server: our libpython first, the venv's bin first on PATH."""
        env = dict(os.environ if base is None else base)
        libs = [str(p) for p in self.library_dirs]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env


def python_libdir() -> Path:
    # The stub embeds the first libpython3.X it finds; it must be this interpreter's own
    # (a pyenv venv otherwise picks the system one and fails with `_PyModule_Add`).
    return Path(sysconfig.get_config_var("LIBDIR"))


def find_triton(scratch: Path) -> TritonInstall:
    """Locate tritonserver; prepare a backends dir under `scratch` when using the wheel."""
    override = os.environ.get("TRITONSERVER_BIN")
    on_path = Path(override) if override else shutil.which("tritonserver")
    if on_path:
        binary = Path(on_path)
        backend_dir = binary.parent.parent / "backends"
        _warn_if_unpatched(backend_dir / "python" / "libtriton_python.so")
        return TritonInstall(binary, backend_dir, (python_libdir(),))
    return _wheel_install(scratch)


def _wheel_install(scratch: Path) -> TritonInstall:
    try:
        import pytriton  # type: ignore[import-not-found]
    except ImportError as exc:
        raise RuntimeError("no tritonserver on PATH and nvidia-pytriton is not installed") from exc
    root = Path(pytriton.__file__).parent / "tritonserver"
    site = root.parent.parent
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"the pytriton wheel has no Python backend stub for Python {version}")
    backend_dir = scratch / "backends"
    if not (backend_dir / "python" / "triton_python_backend_stub").exists():
        _publish_backend(root / "backends" / "python", stub, backend_dir)
    patch_stub_wait(backend_dir / "python" / "libtriton_python.so")  # no-op once patched
    return TritonInstall(root / "bin" / "tritonserver", backend_dir, _library_dirs(site))


def _publish_backend(source: Path, stub: Path, backend_dir: Path) -> None:
    """Copy the Python backend + stub into place atomically: several launchers (tests start
    replicas in parallel) may prepare the same directory at once."""
    backend_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=backend_dir, prefix=".python-"))
    try:
        shutil.copytree(source, staging / "python")
        shutil.copy2(stub, staging / "python" / "triton_python_backend_stub")
        patch_stub_wait(staging / "python" / "libtriton_python.so")
        target = backend_dir / "python"
        if target.exists() and not (target / "triton_python_backend_stub").exists():
            shutil.rmtree(target, ignore_errors=True)  # left half-copied by an older launcher
        try:
            os.rename(staging / "python", target)
        except OSError:
            if not (target / "triton_python_backend_stub").exists():
                raise
            # another launcher published first: its copy is the same
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _warn_if_unpatched(library: Path) -> None:
    if library.exists() and (current := stub_wait_state(library)) != "patched":
        print(f"warning: {library} keeps Triton's one-second stub hand-off wait ({current}); a stub paused "
              "for a second during a hand-off aborts the server. Patch it with "
              "`python -m backends.serving.stub_wait_patch` (docs/triton_behaviours.md#server-deaths)",
              file=sys.stderr)


def _library_dirs(site: Path) -> tuple[Path, ...]:
    dirs = [python_libdir(), site / "nvidia_pytriton.libs"]
    cudart = site / "nvidia" / "cuda_runtime" / "lib"  # perf_analyzer needs libcudart.so.12
    if cudart.exists():
        dirs.append(cudart)
    return tuple(dirs)
