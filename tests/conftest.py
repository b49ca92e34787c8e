"""Shared fixtures: a tiny local Qwen2 model + tokenizer and small prompt sets. Nothing touches a hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset, save_tiny  # noqa: E402

torch.set_num_threads(1)  # the machine is shared; tiny models gain little from more


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-qwen2"), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture
def dataset():
    return prompt_dataset(16)


@pytest.fixture
def chat_dataset():
    return prompt_dataset(16, conversational=True)


def tiny_args(cls, tmp_path, **overrides):
    """Small, fast, deterministic settings for end-to-end runs."""
    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_prompt_length=32,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    return cls(**kwargs)
