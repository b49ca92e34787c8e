"""Streaming (`datasets.IterableDataset`) prompts for GRPO: group repetition without a Sampler.

A map-style dataset is ordered by `RepeatSampler`; an iterable one has no indices, so the same order is produced
by iterating: rows are read in chunks of one global generation batch's worth of unique prompts, each row is
repeated G times in a row, and the chunk is repeated `repeat_count` times (one copy per micro-step a generation
serves). Batches are built per process by accelerate without dispatching (rows are dicts of strings, which
accelerate's dispatcher cannot broadcast).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch.utils.data import IterableDataset as TorchIterableDataset

from replayrl.data.streaming import is_streaming


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
        try:
            return super()._get_dataloader(dataset, description, batch_size, sampler_fn, is_training, **kwargs)
        finally:
            config.dispatch_batches = dispatch
