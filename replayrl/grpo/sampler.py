"""`RepeatSampler`: yields prompt indices so that every process receives whole prompt groups; `PromptSamplingMixin`:
the GRPO family's dataloaders built on it."""

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


class PromptSamplingMixin:
    """GRPOTrainer's data loading: one dataloader batch is one process's whole generation batch, in `RepeatSampler`'s
    order (the asynchronous read-ahead, `async_rollouts.generation_batches`, walks the same order)."""

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["prompt"]

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("train_dataset is required to train: GRPOTrainer samples its prompts from it (as in TRL).")
        # One dataloader batch = one process's whole generation batch (the sampler repeats it per micro-step).
        return self._get_dataloader(
            dataset=self.train_dataset,
            description="Training",
            batch_size=self._train_batch_size * self.args.steps_per_generation,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def _get_train_sampler(self, dataset=None, repeat_count: int | None = None) -> RepeatSampler:
        """`repeat_count`: each generation batch's repeats (default: one per micro-step it serves)."""
        return RepeatSampler(
            dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.generate_every if repeat_count is None else repeat_count,
            shuffle=self.args.shuffle_dataset,
            seed=self.args.seed,
        )

    def _get_eval_sampler(self, eval_dataset) -> RepeatSampler:
        from replayrl.grpo.checks import check_eval_batch

        check_eval_batch(self.args)  # checked at construction too when eval_dataset was given there
        return RepeatSampler(
            eval_dataset, mini_repeat_count=self.num_generations_eval, shuffle=False, seed=self.args.seed
        )
