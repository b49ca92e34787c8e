"""Streaming (`datasets.IterableDataset`) prompts for GRPO: group repetition without a Sampler.

A map-style dataset is ordered by `RepeatSampler`; an iterable one has no indices, so the same order is produced
by iterating: rows are read in chunks of one global generation batch's worth of unique prompts, each row is
repeated G times in a row, and the chunk is repeated `repeat_count` times (one copy per micro-step a generation
serves). Batches are built per process by accelerate without dispatching (rows are dicts of strings, which
accelerate's dispatcher cannot broadcast).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from torch.utils.data import IterableDataset as TorchIterableDataset

from replayrl.data.streaming import is_streaming

logger = logging.getLogger(__name__)


def prepare_streaming_datasets(args, train_dataset, eval_dataset) -> None:
    """TRL 1.16's rules for iterable (streaming) datasets, applied at construction: accelerate's
    `dispatch_batches` is turned off (each process reads its own slice of the stream; set explicitly to True it is
    a ValueError), and an iterable train set is read by one worker (`dataloader_num_workers=0`: several workers
    would interleave the stream and split the groups). An iterable eval set keeps the train set's workers: its
    loader alone uses one (see `_get_dataloader`)."""
    evals = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
    if not (is_streaming(train_dataset) or any(is_streaming(d) for d in evals)):
        return
    if args.accelerator_config.dispatch_batches:
        raise ValueError(
            "Iterable datasets require `dispatch_batches=False`, but it is set to `True` in `accelerator_config`. "
            "Please set it to `False` (or leave it unset): each process reads its own slice of the stream."
        )
    args.accelerator_config.dispatch_batches = False
    if is_streaming(train_dataset) and args.dataloader_num_workers != 0:
        logger.warning(
            "Iterable datasets require `dataloader_num_workers=0` to preserve prompt grouping; overriding the "
            f"provided value ({args.dataloader_num_workers})."
        )
        args.dataloader_num_workers = 0


class RepeatIterable(TorchIterableDataset):
    """Yields the rows of ``source`` as `RepeatSampler` yields indices: ``chunk_size`` unique rows per chunk, each
    repeated ``mini_repeat_count`` times consecutively, the chunk ``repeat_count`` times; a short last chunk is
    dropped. ``set_epoch`` is forwarded (a shuffled `datasets.IterableDataset` reshuffles per epoch)."""

    def __init__(self, source: Iterable, mini_repeat_count: int, chunk_size: int, repeat_count: int = 1):
        self.source = source
        self.mini_repeat_count = mini_repeat_count
        self.chunk_size = chunk_size
        self.repeat_count = repeat_count

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict]:
        chunk: list[dict] = []
        for row in self.source:
            chunk.append(row)
            if len(chunk) == self.chunk_size:
                yield from self._expand(chunk)
                chunk = []

    def _expand(self, chunk: list[dict]) -> Iterator[dict]:
        for _ in range(self.repeat_count):
            for row in chunk:
                for _ in range(self.mini_repeat_count):
                    yield row


class StreamingDataMixin:
    """GRPOTrainer's data loading for streaming datasets (a mixin of the trainer)."""

    def _get_dataloader(self, dataset, description, batch_size, sampler_fn=None, is_training=False, **kwargs):
        """Streaming datasets: group repetition by iteration (see streaming.py), batches built per process."""
        if not is_streaming(dataset) or isinstance(dataset, RepeatIterable):
            return super()._get_dataloader(dataset, description, batch_size, sampler_fn, is_training, **kwargs)
        G = self.num_generations if is_training else self.num_generations_eval
        repeat = self.generate_every if is_training else 1
        chunk = batch_size * self.accelerator.num_processes // G  # unique prompts per global generation batch
        dataset = RepeatIterable(dataset, mini_repeat_count=G, chunk_size=chunk, repeat_count=repeat)
        config = self.accelerator.dataloader_config
        dispatch, config.dispatch_batches = config.dispatch_batches, False  # rows are dicts of strings
        workers, self.args.dataloader_num_workers = self.args.dataloader_num_workers, 0  # one reader keeps groups
        try:
            return super()._get_dataloader(dataset, description, batch_size, sampler_fn, is_training, **kwargs)
        finally:
            config.dispatch_batches = dispatch
            self.args.dataloader_num_workers = workers
