"""The extra trainer state in a checkpoint: no pickle, written atomically, checked on resume.

A checkpoint directory is *complete* once it holds `replayrl_complete.json`, written last (after the model,
optimizer, RNG and trainer state, and every process's extra state). Resuming uses complete checkpoints only, so
a kill at any moment of a save leaves the previous complete checkpoint as the one to resume from. The marker also
records the size and checksum of every file of the checkpoint (`replayrl.checksums`); resuming recomputes them
and refuses a damaged checkpoint, naming the file and the checkpoint to fall back to (`verify_checkpoint`, also
`replayrl verify CHECKPOINT`).

Extra state is any nest of dicts, lists and tuples whose leaves are tensors or plain JSON values (None, bool,
int, float, str). It is stored as two files: `<name>.safetensors` (every tensor, under a flat key) and
`<name>.json` (the nest, with each tensor replaced by its key). Nothing is ever unpickled: a crafted file can
hold only tensors and JSON, and anything else is refused with `CheckpointError`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from replayrl.model_card import ModelCardMixin

COMPLETE_MARKER = "replayrl_complete.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: missing, incomplete, damaged or made with other settings."""


# --------------------------------------------------------------------------------------------- nests <-> files
def flatten_state(state: Any) -> tuple[dict[str, Any], Any]:
    """(tensors by flat key, JSON skeleton) of a nest; `unflatten_state` inverts it."""
    import torch

    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = value.detach().to("cpu").contiguous().clone()
            return {"__tensor__": key}
        if isinstance(value, dict):
            return {"__dict__": [[_plain_key(k), walk(v)] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return {"__tuple__" if isinstance(value, tuple) else "__list__": [walk(v) for v in value]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
            return value.item()
        raise TypeError(f"cannot store {type(value).__name__} in a checkpoint: only tensors and JSON values")

    return tensors, walk(state)


def _plain_key(key: Any) -> Any:
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    raise TypeError(f"checkpoint dict keys must be plain values, got {type(key).__name__}")


def unflatten_state(tensors: dict[str, Any], skeleton: Any) -> Any:
    if isinstance(skeleton, dict):
        if set(skeleton) == {"__tensor__"}:
            return tensors[skeleton["__tensor__"]]
        if set(skeleton) == {"__dict__"}:
            return {k: unflatten_state(tensors, v) for k, v in skeleton["__dict__"]}
        if set(skeleton) == {"__list__"}:
            return [unflatten_state(tensors, v) for v in skeleton["__list__"]]
        if set(skeleton) == {"__tuple__"}:
            return tuple(unflatten_state(tensors, v) for v in skeleton["__tuple__"])
        raise ValueError(f"unexpected mapping in a state skeleton: keys {sorted(skeleton)}")
    if isinstance(skeleton, list):
        raise ValueError("unexpected bare list in a state skeleton")
    return skeleton


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same directory, fsync, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_extra_state(checkpoint_dir: str | os.PathLike, name: str, state: Any) -> None:
    """Write `state` as `<name>.safetensors` + `<name>.json` in `checkpoint_dir`, each atomically."""
    from safetensors.torch import save_file

    directory = Path(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    tensors, skeleton = flatten_state(state)
    _atomic_write(directory / f"{name}.safetensors", lambda tmp: save_file(tensors, tmp))
    text = json.dumps({"format": "replayrl-state-1", "state": skeleton})
    _atomic_write(directory / f"{name}.json", lambda tmp: Path(tmp).write_text(text))


def load_extra_state(checkpoint_dir: str | os.PathLike, name: str) -> Any:
    """The nest saved by `save_extra_state`; a missing or damaged file is a `CheckpointError` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(checkpoint_dir)
    tensor_file, json_file = directory / f"{name}.safetensors", directory / f"{name}.json"
    for file in (tensor_file, json_file):
        if not file.is_file():
            raise CheckpointError(f"{file} is missing: the checkpoint is incomplete. {_fallback_hint(directory)}")
    try:
        document = json.loads(json_file.read_text())
        tensors = load_file(str(tensor_file))
        if not isinstance(document, dict) or document.get("format") != "replayrl-state-1":
            raise ValueError("not a replayrl state file")
        return unflatten_state(tensors, document["state"])
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as err:
        raise CheckpointError(
            f"{json_file.name} / {tensor_file.name} in {directory} are damaged ({err}). {_fallback_hint(directory)}"
        ) from err


# --------------------------------------------------------------------------------------------- completeness
def mark_complete(checkpoint_dir: str | os.PathLike, info: dict[str, Any]) -> None:
    """Write the completeness marker, last and atomically: `info` (the settings the state depends on) and the
    size and checksum of every other file of the checkpoint (under "checksums")."""
    from replayrl.checksums import record_checksums

    path = Path(checkpoint_dir) / COMPLETE_MARKER
    info = {**info, "checksums": record_checksums(checkpoint_dir, exclude=(COMPLETE_MARKER,))}
    _atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(info, sort_keys=True)))


def verify_checkpoint(checkpoint_dir: str | os.PathLike) -> int:
    """Recompute the checksums the marker recorded; a missing, resized or changed file is a `CheckpointError`
    naming every such file and the checkpoint to fall back to. Returns the number of files checked (0 for a
    marker written before replayrl recorded checksums)."""
    from replayrl.checksums import damaged_files

    path = Path(checkpoint_dir)
    if not is_complete(path):
        raise CheckpointError(f"{path} is incomplete (no {COMPLETE_MARKER}). {_fallback_hint(path)}")
    try:
        recorded = json.loads((path / COMPLETE_MARKER).read_text()).get("checksums")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise CheckpointError(f"{path / COMPLETE_MARKER} is damaged ({err}). {_fallback_hint(path)}") from err
    if recorded is None:
        return 0
    problems = damaged_files(path, recorded)
    if problems:
        listing = "; ".join(f"{name} ({what})" for name, what in problems)
        raise CheckpointError(
            f"checkpoint {path} is damaged: {listing}. Its files changed after the save, so resuming from it would "
            f"train on corrupted state. {_fallback_hint(path)}"
        )
    return len(recorded["files"])


def is_complete(checkpoint_dir: str | os.PathLike) -> bool:
    return (Path(checkpoint_dir) / COMPLETE_MARKER).is_file()


def checkpoints_in(output_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` directories of `output_dir`, by step."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _CHECKPOINT_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    complete = [p for p in checkpoints_in(output_dir) if is_complete(p)]
    return complete[-1] if complete else None


def _fallback_hint(checkpoint_dir: Path) -> str:
    earlier = [p for p in checkpoints_in(checkpoint_dir.parent) if is_complete(p) and p != checkpoint_dir]
    if earlier:
        return f"Resume from {earlier[-1]} instead (the last complete checkpoint)."
    return "There is no complete checkpoint to fall back to in that directory: start a new run."


def resolve_resume(resume_from_checkpoint: str | bool | None, output_dir: str, verify: bool = True) -> Path | None:
    """The checkpoint to resume from: `True` means the last complete one in `output_dir` (an error if none);
    a path must be a complete checkpoint. Incomplete ones (a save that was killed) are never used, and with
    `verify` a damaged one is an error (`verify_checkpoint`)."""
    path = _resolve_resume(resume_from_checkpoint, output_dir)
    if path is not None and verify:
        verify_checkpoint(path)
    return path


def _resolve_resume(resume_from_checkpoint: str | bool | None, output_dir: str) -> Path | None:
    if resume_from_checkpoint in (None, False):
        return None
    if resume_from_checkpoint is True:
        found = last_complete_checkpoint(output_dir)
        if found is None:
            incomplete = checkpoints_in(output_dir)
            detail = f" ({len(incomplete)} incomplete ones were skipped)" if incomplete else ""
            raise CheckpointError(
                f"resume_from_checkpoint=True but output_dir {output_dir!r} has no complete checkpoint{detail}. "
                "Start without resume_from_checkpoint, or point it at a checkpoint directory."
            )
        return found
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise CheckpointError(f"resume_from_checkpoint={str(path)!r} is not a directory.")
    if not is_complete(path):
        raise CheckpointError(
            f"{path} is incomplete (no {COMPLETE_MARKER}: its save was interrupted, or it was not written by "
            f"replayrl). {_fallback_hint(path)}"
        )
    return path


def check_settings(checkpoint_dir: str | os.PathLike, current: dict[str, Any], adaptable: set[str]) -> dict:
    """Compare the settings stored in the marker with `current`. A mismatch in a key outside `adaptable` is a
    `CheckpointError`; the saved values of the adaptable keys that differ are returned (the caller adapts and
    says so)."""
    saved = json.loads((Path(checkpoint_dir) / COMPLETE_MARKER).read_text())
    changed = {k: saved[k] for k in current if k in saved and saved[k] != current[k]}
    fatal = {k: v for k, v in changed.items() if k not in adaptable}
    if fatal:
        details = ", ".join(f"{k}: checkpoint {v!r}, now {current[k]!r}" for k, v in fatal.items())
        raise CheckpointError(
            f"{checkpoint_dir} was written with other settings ({details}); its state cannot be used with them. "
            "Resume with the checkpoint's settings, or start a new run in another output_dir."
        )
    return {k: v for k, v in changed.items() if k in adaptable}


# --------------------------------------------------------------------------------------------- Trainer glue
class SafeCheckpointsMixin(ModelCardMixin):
    """Safe checkpoints for any `transformers.Trainer` subclass (put it first among the bases). Through
    `ModelCardMixin`, every save also writes the model card (`replayrl.model_card`).

    Each save writes the subclass's `_extra_state()` (per process) inside the checkpoint, then the completeness
    marker with `_checkpoint_settings()`, and only then lets old checkpoints be rotated away. `train()` resumes
    from complete checkpoints only, checks the settings, loads the extra state, and refuses to start afresh in
    an `output_dir` that already holds checkpoints unless `overwrite_output_dir=True`. Being every trainer's one
    `train()` entry, it also applies `memory_efficient_layers` (`replayrl.models.lean_layers`) to the model.
    """

    extra_state_name = "replayrl_state"
    adaptable_settings: frozenset[str] = frozenset()
    _tag_names: list[str] = []

    def __init__(self, *args, **kwargs):
        from replayrl.distributed import check_launch_settings

        check_launch_settings(kwargs.get("args"))
        super().__init__(*args, **kwargs)
        # As TRL's trainers: the model carries the trainer's tags (`model.model_tags`, written to its model card).
        if self._tag_names and hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names)

    def _extra_state(self) -> dict:
        """Hook: state that plain Trainer checkpoints lack (tensors and JSON values)."""
        return {}

    def _load_extra_state(self, state: dict) -> None:
        """Hook: restore what `_extra_state` returned."""

    def _checkpoint_settings(self) -> dict[str, Any]:
        """Hook: settings that change what the saved state means; checked on resume."""
        return {"trainer": type(self).__name__}

    def _adapt_settings(self, saved: dict[str, Any]) -> None:
        """Hook: the run's settings differ from the checkpoint's in these `adaptable_settings` keys."""

    def _state_file(self, rank: int) -> str:
        return f"{self.extra_state_name}_rank{rank}"

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        from replayrl.models.peft_reference import reload_trained_adapter

        super()._load_from_checkpoint(resume_from_checkpoint, model)
        reload_trained_adapter(model if model is not None else self.model, resume_from_checkpoint)

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import rotate_checkpoints

        limit = self.args.save_total_limit
        self.args.save_total_limit = None  # rotate only once the new checkpoint is complete
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        run_dir = self._get_output_dir(trial=trial)
        checkpoint = Path(run_dir) / f"checkpoint-{self.state.global_step}"
        save_extra_state(checkpoint, self._state_file(self.args.process_index), self._extra_state())
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            mark_complete(checkpoint, {**self._checkpoint_settings(), "world_size": self.args.world_size})
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kw):
        from replayrl.models.lean_layers import set_lean_layers

        set_lean_layers(self.model, getattr(self.args, "memory_efficient_layers", True))
        checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir)
        if checkpoint is None:
            self._refuse_stale_checkpoints()
        else:
            changed = check_settings(checkpoint, self._checkpoint_settings(), set(self.adaptable_settings))
            name = self._state_file(self.args.process_index)
            if not (checkpoint / f"{name}.json").exists():  # fewer processes wrote it: all hold the same state
                name = self._state_file(0)
            self._load_extra_state(load_extra_state(checkpoint, name))
            self._adapt_settings(changed)
        return super().train(
            resume_from_checkpoint=str(checkpoint) if checkpoint else None,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kw,
        )

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """transformers up to at least 5.17 loads the optimizer of a multi-process run with `map_location=args.device`,
        an indexed `cpu:0` in a multi-process CPU (gloo) run, which `torch.load` cannot restore ("don't know how to
        restore data location ... (tagged with cpu:0)"); newer versions map it to plain "cpu", as done here."""
        import torch

        device = self.args.device
        plain = (
            checkpoint is None
            or device.type != "cpu"
            or self.args.world_size == 1
            or self.is_deepspeed_enabled
            or self.is_fsdp_enabled
            or not os.path.isfile(os.path.join(checkpoint, "optimizer.pt"))
            or not os.path.isfile(os.path.join(checkpoint, "scheduler.pt"))
        )
        if plain:
            return super()._load_optimizer_and_scheduler(checkpoint)
        optimizer = torch.load(os.path.join(checkpoint, "optimizer.pt"), map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(optimizer)
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, "scheduler.pt"), weights_only=True))

    def _refuse_stale_checkpoints(self) -> None:
        delete = self.args.should_save
        refuse_stale_checkpoints(self.args.output_dir, getattr(self.args, "overwrite_output_dir", False), delete)
        self.accelerator.wait_for_everyone()


def refuse_stale_checkpoints(
    output_dir: str | os.PathLike,
    overwrite: bool = False,
    delete: bool = False,
    *,
    resume_hint: str = "resume_from_checkpoint=True",
    overwrite_hint: str | None = "overwrite_output_dir=True",
    elsewhere: str = "another output_dir",
) -> None:
    """A fresh run must not mix with an earlier run's checkpoints (resume would later pick theirs): refuse, or
    with `overwrite`, delete them (when `delete`). The hints name the caller's own options in the error: how to
    resume, how to overwrite (None: the trainer cannot), where else to write."""
    import shutil

    old = checkpoints_in(output_dir)
    if not old:
        return
    if not overwrite:
        replace = f"pass {overwrite_hint} to replace them, " if overwrite_hint else ""
        raise ValueError(
            f"{str(output_dir)!r} already holds checkpoints ({old[-1].name}, ...) from an earlier run. "
            f"Resume it with {resume_hint}, {replace}or choose {elsewhere}."
        )
    if delete:
        for path in old:
            shutil.rmtree(path)


# --------------------------------------------------------------------------------------------- RNG streams
def rng_state(generator: Any = None) -> dict[str, Any]:
    """Every global random stream a run draws from (python's, numpy's, torch's CPU and CUDA ones), plus a
    trainer's own `torch.Generator` under "generator" when given; tensors and JSON only (see `flatten_state`)."""
    import random

    import numpy as np
    import torch

    name, keys, *rest = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), *rest],
        "torch": torch.get_rng_state(),
    }
    if generator is not None:
        state["generator"] = generator.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generator: Any = None) -> None:
    """Restore what `rng_state` captured (after a round trip through a checkpoint: tuples may come back as
    lists). The CUDA streams are restored only where CUDA is available."""
    import random

    import numpy as np
    import torch

    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if generator is not None:
        generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
