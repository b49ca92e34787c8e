"""The recorded TRL 1.16 fields (the JSON files the parity tests read) still equal TRL's own dataclasses, where TRL's
virtualenv is at hand (`benchmarks/.venv-trl`, or the interpreter named by TRL_PYTHON); skipped elsewhere."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRL_PYTHON = Path(os.environ.get("TRL_PYTHON", ROOT / "benchmarks" / ".venv-trl" / "bin" / "python"))


@pytest.mark.skipif(not TRL_PYTHON.is_file(), reason=f"no TRL interpreter at {TRL_PYTHON}")
def test_records_equal_trls_dataclasses():
    check = [str(TRL_PYTHON), str(ROOT / "scripts" / "record_trl_fields.py"), "--check"]
    proc = subprocess.run(check, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
