"""Every field of TRL 1.16's config dataclasses, with its default, recorded from TRL's source (the JSON files
here: `dataclasses.fields(trl.XConfig)`), checked against replayrl's config of the same name."""

import dataclasses
import json
from pathlib import Path


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def mismatches(config_cls, name: str) -> list[str]:
    """'field: problem' for each TRL field that replayrl's `config_cls` lacks or defaults differently."""
    trl = json.loads((Path(__file__).parent / f"{name}.json").read_text())["fields"]
    ours = {f.name: repr(_default(f)) for f in dataclasses.fields(config_cls)}
    problems = [f"{field}: missing" for field in trl if field not in ours]
    differ = [field for field in trl if field in ours and ours[field] != trl[field]]
    problems += [f"{field}: TRL {trl[field]}, ours {ours[field]}" for field in differ]
    return problems
