"""`RepeatSampler`: yields prompt indices so that every process receives whole prompt groups."""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class RepeatSampler(Sampler[int]):
    """Index order for GRPO data loading (TRL's scheme).

    Unique prompts are drawn in chunks of `batch_size` (one global generation batch); inside a chunk each
    index is repeated `mini_repeat_count` (= G) times in a row, so consecutive slices of the index stream -
    which is how accelerate shards batches across processes - hold whole groups; the whole chunk is then
    repeated `repeat_count` times (num_iterations * steps_per_generation) so that the Trainer's
    one-batch-per-micro-step accounting sees the same prompts for every micro-step that one generation
    serves. Incomplete trailing chunks are dropped. The permutation depends on `seed` and the epoch only,
    so a resumed run sees the same order.

    Example: 4 prompts, mini_repeat_count=2, batch_size=2, repeat_count=2, no shuffle ->
    0 0 1 1 0 0 1 1 2 2 3 3 2 2 3 3
    """

    def __init__(
        self,
        data_source,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int = 0,
    ):
        self.num_samples = len(data_source)
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        chunks = [order[i : i + self.batch_size] for i in range(0, self.num_samples, self.batch_size)]
        for chunk in (c for c in chunks if len(c) == self.batch_size):
            for _ in range(self.repeat_count):
                for index in chunk:
                    yield from [index] * self.mini_repeat_count

    def __len__(self) -> int:
        return (self.num_samples // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count
