"""Asynchronous GRPO with a KL term (`beta > 0`) and a frozen reference model: the generation worker computes the
reference log-probs of each batch right after sampling it, with the trainer's own code, and the trainer skips its
reference forward for those batches; a batch the trainer claims while the worker starts gets them from the same
code; PEFT and `sync_ref_model=True` keep the trainer's forward (docs/async.md)."""

import time

import pytest
import torch
from transformers import TrainerCallback

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.grpo.async_rollouts import worker_reference
from tests.conftest import tiny_args
from tests.grpo.test_async import small_model, varied_reward


class RefRecorder:
    """Per trained micro-batch: its reference log-probs as they reached the loss, the trainer's own reference
    forward of the same rows, the real-token mask; and how often the trainer ran `_reference_logps`."""

    def __init__(self, trainer):
        self.batches, self.reference_calls = [], 0
        loss, reference = trainer.compute_loss, trainer._reference_logps

        def compute_loss(model, inputs, *args, **kwargs):
            if model.training:
                with torch.no_grad():
                    own = trainer._token_logps(trainer.ref_model, inputs)[0] if trainer.ref_model is not None else None
                mask = inputs.completion_mask.bool()
                self.batches.append(dict(ref=inputs.ref_logps.clone(), own=own, mask=mask))
            return loss(model, inputs, *args, **kwargs)

        def reference_logps(rollout):
            self.reference_calls += 1
            return reference(rollout)

        trainer.compute_loss, trainer._reference_logps = compute_loss, reference_logps


class WaitForWorkerAfterFirstStep(TrainerCallback):
    """After step 1 (batches 0 and 1 may have been claimed by the trainer), wait until the worker's models are
    built, so that the following batches are the worker's."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        deadline = time.monotonic() + 60
        while state.global_step == 1 and not self.trainer._async.worker._ready.value:
            assert time.monotonic() < deadline, "the worker did not start in 60 s"
            time.sleep(0.05)


def where_sampled(trainer) -> list[bool]:
    """Per taken batch, in order: True when the trainer sampled it itself (claimed), False for the worker's."""
    here, log = [], trainer._async._log

    def record(result, waited):
        here.append(result.here)
        return log(result, waited)

    trainer._async._log = record
    return here


def test_the_worker_computes_the_reference_log_probs_of_claimed_and_worker_batches(tokenizer, dataset, tmp_path):
    args = tiny_args(GRPOConfig, tmp_path, async_generation=True, beta=0.04, max_steps=4, temperature=0.7)
    model = small_model(tokenizer)
    trainer = GRPOTrainer(model=model, reward_funcs=varied_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer)  # fmt: skip
    record, here = RefRecorder(trainer), where_sampled(trainer)
    trainer.add_callback(WaitForWorkerAfterFirstStep(trainer))
    assert worker_reference(trainer) is not None
    trainer.train()
    assert here[0] and not any(here[2:]) and len(here) == 4  # batch 0 is claimed, batches 2-3 are the worker's
    assert record.reference_calls == 0  # the trainer never ran its reference forward
    assert len(record.batches) == 4
    for b in record.batches:  # what reached the loss is the trainer's own reference forward of those rows
        torch.testing.assert_close(b["ref"][b["mask"]], b["own"][b["mask"]], atol=1e-5, rtol=1e-5)
        assert b["ref"].dtype == torch.float32
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["async/producer_ref_logps"] > 0 and h["kl"] > 0 for h in logs[1:])


@pytest.mark.parametrize("fallback", ["peft", "sync_ref_model"])
def test_peft_and_sync_ref_model_keep_the_trainers_reference_forward(fallback, tokenizer, dataset, tmp_path):
    """PEFT's reference is the policy with its adapter off (it is not a separate frozen model) and TR-DPO
    (`sync_ref_model=True`) moves the reference during training: the trainer computes them, every batch."""
    from peft import LoraConfig

    extra = dict(sync_ref_model=True, ref_model_sync_steps=1) if fallback == "sync_ref_model" else {}
    args = tiny_args(GRPOConfig, tmp_path, async_generation=True, beta=0.04, max_steps=2, **extra)
    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if fallback == "peft" else None
    trainer = GRPOTrainer(model=small_model(tokenizer), reward_funcs=varied_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=peft_config)  # fmt: skip
    record = RefRecorder(trainer)
    assert worker_reference(trainer) is None
    trainer.train()
    assert record.reference_calls == 2 and len(record.batches) == 2
    for b in record.batches:
        assert torch.isfinite(b["ref"][b["mask"]]).all()
        if b["own"] is not None:  # sync_ref_model: the trainer's reference forward itself (no PEFT ref model)
            torch.testing.assert_close(b["ref"][b["mask"]], b["own"][b["mask"]], atol=0, rtol=0)
