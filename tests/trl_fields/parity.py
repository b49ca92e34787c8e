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
    names differently or not at all (an older one, e.g. the declared floor), or defaults differently from the
    transformers TRL was recorded with: not replayrl's to add or change, since TRL's config on the installed
    transformers would not have them either. A field TRL overrides (its default differs from transformers' own,
    e.g. `logging_steps=10`) is still checked where the installed transformers agrees with the recorded one."""
    from transformers import TrainingArguments

    installed = {f.name: repr(_default(f)) for f in dataclasses.fields(TrainingArguments)}
    own = recorded["training_arguments"]
    return {f for f in own if f not in installed or installed[f] != own[f]}


def mismatches(config_cls, name: str, deliberate: dict[str, str] | None = None) -> list[str]:
    """'field: problem' for each TRL field that replayrl's `config_cls` lacks or defaults differently, leaving out
    the fields in `deliberate` ({field: the documented reason}); a deliberate field that no longer differs is
    reported too (where the installed transformers lets it be checked), so the allow-list cannot go stale."""
    recorded = json.loads((Path(__file__).parent / f"{name}.json").read_text())
    skip = _transformers_owned(recorded)
    trl = {field: default for field, default in recorded["fields"].items() if field not in skip}
    ours = {f.name: repr(_default(f)) for f in dataclasses.fields(config_cls)}
    deliberate = deliberate or {}
    problems = [f"{field}: missing" for field in trl if field not in ours]
    differ = [field for field in trl if field in ours and ours[field] != trl[field]]
    problems += [f"{field}: TRL {trl[field]}, ours {ours[field]}" for field in differ if field not in deliberate]
    stale = [field for field in deliberate if field in trl and field not in differ]
    problems += [f"{field}: listed as deliberate but equals TRL" for field in stale]
    return problems
