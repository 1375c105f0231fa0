# MiniCPM-o 4.5 full-duplex voice on Triton Inference Server (deploy/README.md "Container").
#
#   docker build -t minicpmo-duplex-triton .
#   docker run --rm --gpus all --shm-size=4g --stop-timeout 40 \
#       -p 8000:8000 -p 8001:8001 -p 8002:8002 minicpmo-duplex-triton --profile gpu
#
# The base image's server is tritonserver 2.51.0 (NGC 24.10, CUDA 12.6), the release inside the
# nvidia-pytriton 0.7.0 wheel that pyproject.toml pins for local runs, so the container and
# the tests run the same server. The launcher finds /opt/tritonserver/bin/tritonserver on PATH.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    MINICPMO_HOME=/var/lib/minicpmo \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

WORKDIR /opt/minicpmo

# The pinned transformers needs Python >= 3.11 and the base image's is 3.10, so the package
# lives in a Python 3.11 virtual environment (its bin first on PATH: the launcher, the health
# check and the stub's embedded interpreter all use it). perf_analyzer (tritonclient[all])
# loads libb64 (perf/pa_data/README.md); the base image has libcudart itself.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libb64-0d python3.11 python3.11-venv libpython3.11 \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv

# The Python backend stub of this same server (2.51.0) built for Python 3.11, from the
# nvidia-pytriton wheel that pyproject.toml pins, in place of the image's 3.10 one.
RUN python3 -m pip install --no-deps "nvidia-pytriton==0.7.0" \
    && cp "$(python3 -c 'import importlib.util as u, pathlib as p; print(p.Path(u.find_spec("pytriton").origin).parent)')/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub" \
        /opt/tritonserver/backends/python/triton_python_backend_stub \
    && python3 -m pip uninstall -y nvidia-pytriton

# torch built for the base image's CUDA (12.6), from PyTorch's wheel index for that CUDA: the
# PyPI wheel of this release is built for CUDA 13 and brings a CUDA 13 runtime, which a host
# driver able to run this base image may not load. Then triton exactly as the tests pin it
# (pyproject.toml `test` extra: the kernels they check), over the one torch names.
# tests/deploy/test_dockerfile.py resolves these installs for the image's Python and platform.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu126
RUN python3 -m pip install --index-url "${TORCH_INDEX}" --extra-index-url https://pypi.org/simple \
        "torch==2.13.0" \
    && python3 -m pip install --no-deps "triton==3.6.0"

# The other dependencies, pinned exactly as in pyproject.toml (a test compares them), and
# tritonclient[all]'s CUDA bindings held to the base image's CUDA major (unpinned, they would
# be CUDA 13's). Not installed: nvidia-cuda-runtime-cu12 (the image has the CUDA runtime).
# onnxruntime is the CPU build (deploy/README.md "Voice models" says how to run those models
# on the GPU instead).
RUN python3 -m pip install \
        "transformers==5.24.0" \
        "numpy>=1.26,<2" \
        "tritonclient[all]==2.51.0" \
        "cuda-python>=12.6,<13" \
        "pyyaml>=6" \
        "safetensors>=0.4" \
        "tokenizers>=0.20" \
        "soundfile>=0.12" \
        "soxr>=0.3" \
        "sounddevice>=0.4" \
        "onnxruntime==1.23.2"

# The package (backends/: every model.py imports it; client/: minicpmo-client).
COPY pyproject.toml ./
COPY backends ./backends
COPY client ./client
# Then the Python backend's stub hand-off wait: one second, after which the server gives up on
# a request and the stub's late answer aborts it; the launcher patches the wheel's copy, this
# the image's own (docs/triton_behaviours.md#server-deaths). The build stops on a backend
# build the patch does not recognise.
RUN python3 -m pip install --no-deps . \
    && python3 -m backends.serving.stub_wait_patch /opt/tritonserver/backends/python/libtriton_python.so

# The model repository: config.pbtxt.tmpl files are rendered per profile at start-up.
COPY model_repository ./model_repository

# Rendered repositories, logs and the generated tiny checkpoint live in the work directory;
# mount a volume there to keep them (or a real checkpoint: --set checkpoint=/var/lib/minicpmo/ckpt).
RUN useradd --create-home --uid 10001 minicpmo \
    && mkdir -p /var/lib/minicpmo \
    && chown minicpmo /var/lib/minicpmo
USER 10001
VOLUME ["/var/lib/minicpmo"]

# HTTP, gRPC (clients; the duplex stream), metrics (Prometheus: /metrics).
EXPOSE 8000 8001 8002

# Ready only while every stage can serve (its `health` action, asked over gRPC), not just while
# loaded; at the ports the launcher serves, whatever --http-port / --grpc-port say (it writes
# them to its workdir's endpoints.json).
HEALTHCHECK --interval=30s --timeout=20s --start-period=600s --retries=3 \
    CMD ["python3", "-m", "backends.serving.health", "--endpoints", "/var/lib/minicpmo/endpoints.json"]

ENTRYPOINT ["minicpmo-server", "--address", "0.0.0.0", \
            "--repository", "/opt/minicpmo/model_repository", "--workdir", "/var/lib/minicpmo"]
CMD ["--profile", "gpu"]
