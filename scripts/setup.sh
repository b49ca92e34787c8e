#!/usr/bin/env bash
# Set up .venv for replayrl: torch first (the CPU wheel, so that no CUDA packages are pulled in), then the
# package with its test extra. Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test]"
