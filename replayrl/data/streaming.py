"""Streaming training data (`datasets.IterableDataset`, as TRL accepts) for the SFT, DPO and reward trainers:
what they need to know about a dataset without random access, and the one rule transformers sets for it
(no length, so `max_steps` says how long to train)."""

from __future__ import annotations

import logging

from torch.utils.data import IterableDataset as TorchIterableDataset

logger = logging.getLogger(__name__)


def is_streaming(dataset) -> bool:
    """A dataset without random access: `datasets.IterableDataset` or a torch IterableDataset."""
    if isinstance(dataset, TorchIterableDataset):
        return True
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a core dependency
        return False
    return isinstance(dataset, datasets.IterableDataset)


def first_row(dataset) -> dict | None:
    """The first example (None when empty); a streaming dataset is read up to it, not further."""
    if is_streaming(dataset):
        return next(iter(dataset), None)
    return dataset[0] if len(dataset) else None


def column_names(dataset) -> list[str]:
    """The dataset's columns; for a streaming dataset without declared features, the first example's keys."""
    names = getattr(dataset, "column_names", None)
    if names is not None:
        return list(names)
    row = first_row(dataset)
    return list(row) if row is not None else []


def map_options(dataset, num_proc: int | None, desc: str | None = None) -> dict:
    """`Dataset.map` options that a streaming dataset's (lazy) `map` does not take are left out for it."""
    if is_streaming(dataset):
        return {}
    return {"num_proc": num_proc, **({"desc": desc} if desc else {})}


def drop_rows(dataset, keep, desc: str, none_left: str, dropped: str):
    """`dataset.filter(keep)` as preparation drops rows: a streaming dataset lazily (uncounted); otherwise a
    ValueError `none_left` when no row is kept, and a warning `dropped` (with `%d of %d` for the dropped and total
    counts) when some are dropped."""
    if is_streaming(dataset):
        return dataset.filter(keep)
    n = len(dataset)
    dataset = dataset.filter(keep, desc=desc)
    if n and not len(dataset):
        raise ValueError(none_left)
    if len(dataset) < n:
        logger.warning(dropped, n - len(dataset), n)
    return dataset


def check_train_dataset(dataset, trainer: str) -> None:
    """As TRL 1.16's SFT, DPO, reward and KTO trainers, before any loading: a `train_dataset` is required, and a
    `DatasetDict` (a mapping of splits, not rows) is refused with the split to pass instead."""
    if dataset is None:
        raise ValueError(f"{trainer}: `train_dataset` is required; pass a datasets.Dataset (or IterableDataset).")
    if isinstance(dataset, dict):  # datasets' DatasetDict / IterableDatasetDict are dicts of splits
        splits = ", ".join(repr(k) for k in dataset)
        raise TypeError(
            f"{trainer}: `train_dataset` must be a `Dataset` or `IterableDataset`, got `{type(dataset).__name__}` "
            f"(splits {splits}); pass one split, e.g. train_dataset=dataset['train']."
        )


def prepare_streaming_training(args, dataset, trainer: str) -> None:
    """`check_train_dataset`; then, for a streaming train_dataset: `max_steps` > 0 is required (transformers: it has
    no length), checked at construction; and, as TRL, accelerate's `dispatch_batches` is turned off (each process
    reads its own batches; dispatching would concatenate batches of different widths), with a warning when it was
    set to True."""
    check_train_dataset(dataset, trainer)
    if not is_streaming(dataset):
        return
    if args.max_steps <= 0:
        raise ValueError(
            f"{trainer}: train_dataset is a streaming (Iterable) dataset, which has no length, so max_steps must be "
            f"set (got max_steps={args.max_steps}); pass e.g. max_steps=1000 in the config (TRL and transformers "
            "require it too)."
        )
    if args.accelerator_config.dispatch_batches is True:
        logger.warning(
            f"{trainer}: dispatch_batches=True is turned off for a streaming train_dataset (as TRL does); leave it "
            "unset or False to silence this."
        )
    args.accelerator_config.dispatch_batches = False
