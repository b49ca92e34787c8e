#!/usr/bin/env bash
# Set up a SEPARATE virtualenv (default .venv-floor, override with FLOOR_VENV=path) holding the LOWEST versions that
# pyproject.toml declares for torch, transformers, accelerate and datasets, so that CI tests the floors it declares
# (.ci/run). The floors are read from pyproject.toml and passed to pip as constraints: a floor that cannot be
# installed together with the rest of the declared dependencies is an error here, not a surprise for a user.
# torch: only a CPU wheel is installed (scripts/setup.sh's rule), so torch's floor is a version with a CPU wheel here.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${FLOOR_VENV:-.venv-floor}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
CONSTRAINTS="$VENV/floor-constraints.txt"
"$PY" - >"$CONSTRAINTS" <<'PYEOF'
import re
from pathlib import Path

text = Path("pyproject.toml").read_text()
deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
for name in ("torch", "transformers", "accelerate", "datasets"):
    floor = re.search(rf'"{name}>=([0-9.]+)', deps)
    if floor is None:
        raise SystemExit(f"pyproject.toml declares no floor (>=) for {name}")
    print(f"{name}=={floor.group(1)}")
PYEOF
"$PY" -m pip install -q --upgrade pip >/dev/null
# torch alone first: the CPU wheel, so that nothing pulls a CUDA build
"$PY" -m pip install -q -c "$CONSTRAINTS" torch
"$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[test]"
"$PY" -c "import importlib.metadata as m
print('floor venv:', ', '.join(f'{n} {m.version(n)}' for n in ('torch', 'transformers', 'accelerate', 'datasets')))"
