"""Settings under which accelerate would silently not run the DeepSpeed that `accelerate launch` asked for are
refused before any work, with the fix in the message."""

from types import SimpleNamespace

import pytest

from replayrl.distributed import check_launch_settings


@pytest.fixture
def deepspeed_launch(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    yield
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()  # a config built under the variable leaves transformers' DeepSpeed config set


def test_use_cpu_under_deepspeed_is_refused(deepspeed_launch):
    with pytest.raises(ValueError, match=r"use_cpu=True .*ddp_backend='gloo'"):
        check_launch_settings(SimpleNamespace(use_cpu=True, ddp_backend=None))


def test_accelerate_use_cpu_under_deepspeed_is_refused(deepspeed_launch, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    with pytest.raises(ValueError, match="ACCELERATE_USE_CPU"):
        check_launch_settings(SimpleNamespace(use_cpu=False, ddp_backend="gloo"))


def test_deepspeed_without_gpu_needs_a_backend(deepspeed_launch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: accelerate picks NCCL itself")
    with pytest.raises(ValueError, match="ddp_backend='gloo'"):
        check_launch_settings(SimpleNamespace(use_cpu=False, ddp_backend=None))
    check_launch_settings(SimpleNamespace(use_cpu=False, ddp_backend="gloo"))  # the documented CPU settings


def test_without_deepspeed_nothing_is_checked(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    check_launch_settings(SimpleNamespace(use_cpu=True, ddp_backend=None))


def test_a_trainer_refuses_before_training(deepspeed_launch, tokenizer, model, tmp_path):
    from replayrl import SFTConfig, SFTTrainer
    from tests.sft.helpers import varied_dataset

    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1)
    with pytest.raises(ValueError, match="use_cpu=True"):
        SFTTrainer(model, args=args, train_dataset=varied_dataset(), processing_class=tokenizer)
