"""One real tritonserver (cpu profile, tiny model, 3 sessions) and one gateway process in front
of it, shared by every gateway test of the run."""
from __future__ import annotations

import pytest

from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess
from backends.serving.profiles import get_profile
from gateway_process import GatewayProcess
from gateway_settings import EXIT_ARGS, SERVER_OVERRIDES


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    options = ServerOptions(profile=get_profile("cpu").with_overrides(SERVER_OVERRIDES), workdir=PROJECT_ROOT / "var",
                            log_file=tmp_path_factory.mktemp("triton-gateway") / "server.log", extra_args=EXIT_ARGS)
    with ServerProcess(options) as proc:
        yield proc


@pytest.fixture(scope="session")
def gateway(server, tmp_path_factory):
    proc = GatewayProcess(server.grpc_url, tmp_path_factory.mktemp("gateway"))
    yield proc
    proc.stop()
