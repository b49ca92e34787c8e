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


def _transformers_owned(recorded: dict) -> set[str]:
    """The recorded fields that come from `transformers.TrainingArguments` but that the installed transformers
    names differently or not at all (an older one, e.g. the declared floor), or defaults differently: not
    replayrl's to add or change, since TRL's config on that transformers would not have them either."""
    from transformers import TrainingArguments

    installed = {f.name: repr(_default(f)) for f in dataclasses.fields(TrainingArguments)}
    own = recorded.get("training_arguments", [])
    return {f for f in own if f not in installed or installed[f] != recorded["fields"][f]}


def mismatches(config_cls, name: str) -> list[str]:
    """'field: problem' for each TRL field that replayrl's `config_cls` lacks or defaults differently."""
    recorded = json.loads((Path(__file__).parent / f"{name}.json").read_text())
    skip = _transformers_owned(recorded)
    trl = {field: default for field, default in recorded["fields"].items() if field not in skip}
    ours = {f.name: repr(_default(f)) for f in dataclasses.fields(config_cls)}
    problems = [f"{field}: missing" for field in trl if field not in ours]
    differ = [field for field in trl if field in ours and ours[field] != trl[field]]
    problems += [f"{field}: TRL {trl[field]}, ours {ours[field]}" for field in differ]
    return problems
