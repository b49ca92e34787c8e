"""Record every field of TRL's GRPOConfig, RLOOConfig, KTOConfig, DistillationConfig, SFTConfig, DPOConfig and
RewardConfig, with its default, for the field-parity tests (`tests/trl_fields/<name>.json`, read by
`tests/trl_fields/parity.py`). Run with TRL's interpreter:

    benchmarks/.venv-trl/bin/python scripts/record_trl_fields.py           # (re-)write the records
    benchmarks/.venv-trl/bin/python scripts/record_trl_fields.py --check   # exit 1 naming what differs

A default is recorded as its `repr` (a default_factory's value); `training_arguments` maps the fields that TRL's
config takes from `transformers.TrainingArguments` to transformers' own default for them, so that the parity check
can tell a TRL override (e.g. `logging_steps=10`, checked) from a field that the installed transformers names or
defaults differently (e.g. the floor's: skipped, not replayrl's to change).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "trl_fields"
CONFIGS = {
    "grpo": "GRPOConfig",
    "rloo": "RLOOConfig",
    "kto": "KTOConfig",
    "distillation": "DistillationConfig",
    "sft": "SFTConfig",
    "dpo": "DPOConfig",
    "reward": "RewardConfig",
}


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return repr(None)


def record(name: str) -> dict:
    """The record of `trl.<CONFIGS[name]>` under the running interpreter's TRL and transformers."""
    import transformers
    import trl

    cls = getattr(trl, CONFIGS[name])
    base = {f.name: _default(f) for f in dataclasses.fields(transformers.TrainingArguments)}
    fields = dataclasses.fields(cls)
    v_trl, v_tf = trl.__version__, transformers.__version__
    return {
        "_source": f"trl {v_trl} {cls.__name__}, transformers {v_tf}: every dataclass field and its default (repr)",
        "fields": {f.name: _default(f) for f in fields},
        "training_arguments": {f.name: base[f.name] for f in fields if f.name in base},
        "_training_arguments_note": f"fields of transformers {v_tf}'s TrainingArguments, with transformers' own "
        "default: checked only where the installed transformers has them with that default",
    }


def differences(old: dict, new: dict) -> list[str]:
    keys = list(dict.fromkeys([*old.get("fields", {}), *new["fields"]]))
    out = [f"{k}: recorded {old.get('fields', {}).get(k)}, TRL {new['fields'].get(k)}" for k in keys
           if old.get("fields", {}).get(k) != new["fields"].get(k)]  # fmt: skip
    if old.get("training_arguments") != new["training_arguments"]:
        out.append("training_arguments differ")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the records instead of writing them")
    args = parser.parse_args(argv)
    status = 0
    for name in CONFIGS:
        path, new = RECORDS / f"{name}.json", record(name)
        if args.check:
            old = json.loads(path.read_text()) if path.is_file() else {}
            for line in differences(old, new):
                print(f"{name}: {line}")
                status = 1
        else:
            path.write_text(json.dumps(new, indent=0) + "\n")
            print(f"wrote {path} ({len(new['fields'])} fields)")
    return status


if __name__ == "__main__":
    sys.exit(main())
