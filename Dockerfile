# MiniCPM-o 4.5 full-duplex voice on Triton Inference Server (deploy/README.md "Container").
#
#   docker build -t minicpmo-duplex-triton .
#   docker run --rm --gpus all --shm-size=4g --stop-timeout 40 \
#       -p 8000:8000 -p 8001:8001 -p 8002:8002 minicpmo-duplex-triton --profile gpu
#
# The base image's server is tritonserver 2.51.0 (NGC 24.10), the release inside the
# nvidia-pytriton 0.7.0 wheel that pyproject.toml pins for local runs, so the container and
# the tests run the same server. The launcher finds /opt/tritonserver/bin/tritonserver on PATH.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    MINICPMO_HOME=/var/lib/minicpmo

WORKDIR /opt/minicpmo

# The heavy dependencies in their own layer, pinned exactly as in pyproject.toml (a test
# compares them). torch from PyPI is the CUDA build and brings its CUDA libraries along.
# Not installed: nvidia-pytriton (this image's /opt/tritonserver is that same server) and
# nvidia-cuda-runtime-cu12 (the image has the CUDA runtime). onnxruntime is the CPU build
# (deploy/README.md "Voice models" says how to run those models on the GPU instead).
RUN python3 -m pip install \
        "torch==2.13.0" \
        "transformers==5.24.0" \
        "numpy>=1.26,<2" \
        "tritonclient[all]==2.51.0" \
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
RUN python3 -m pip install --no-deps .

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

# Ready only while every stage can serve (its `health` action, asked over gRPC port 8001),
# not just while loaded.
HEALTHCHECK --interval=30s --timeout=20s --start-period=600s --retries=3 \
    CMD ["python3", "-m", "backends.serving.health", "--url", "http://127.0.0.1:8000"]

ENTRYPOINT ["minicpmo-server", "--address", "0.0.0.0", \
            "--repository", "/opt/minicpmo/model_repository", "--workdir", "/var/lib/minicpmo"]
CMD ["--profile", "gpu"]
