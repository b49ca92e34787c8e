"""Small pieces shared by the SFT tests: settings, datasets and a collator wrapper that records batches."""

from datasets import Dataset

from replayrl import SFTConfig


def sft_args(tmp_path, **overrides) -> SFTConfig:
    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        max_length=64,
    )
    kwargs.update(overrides)
    return SFTConfig(**kwargs)


def addition_dataset(n: int | None = None) -> Dataset:
    pairs = [(a, b) for a in range(5) for b in range(5)][:n]
    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "completion": [str(a + b) for a, b in pairs]})


class Recorder:
    """Wraps a trainer's compute_loss and keeps every batch it saw: what was actually trained on."""

    def __init__(self, trainer):
        self.inner, self.batches = trainer.compute_loss, []
        trainer.compute_loss = self

    def __call__(self, model, inputs, *args, **kwargs):
        self.batches.append({k: v.detach().clone() for k, v in inputs.items()})
        return self.inner(model, inputs, *args, **kwargs)


def record(trainer) -> Recorder:
    return Recorder(trainer)


def trained_texts(tokenizer, batch) -> list[str]:
    """Per row, the decoded label tokens that reach the loss (after the causal shift)."""
    labels = batch["labels"][:, 1:]
    return [tokenizer.decode(row[row != -100]) for row in labels]


def varied_dataset() -> Dataset:
    """Four rows whose completions differ a lot in length: a per-micro-batch mean would weight tokens unevenly."""
    return Dataset.from_dict({"prompt": ["a=", "b=", "c=", "d="], "completion": ["1", "123456789", "12", "1234"]})
