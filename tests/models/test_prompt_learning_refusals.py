"""Trainers where a prompt-learning PEFT adapter cannot work soundly refuse it, naming the config and the fix."""

import pytest

from replayrl import DistillationTrainer
from replayrl.models.tiny import build_tiny_model, build_tiny_sequence_classifier, prompt_dataset
from replayrl.models.value_head import AutoModelForCausalLMWithValueHead
from replayrl.ppo import PPOConfig, PPOTrainer
from replayrl.reward import RewardTrainer
from replayrl.tasks.preferences import preference_datasets
from tests.distillation.test_trainer import dist_args
from tests.reward.test_trainer import rm_args

peft = pytest.importorskip("peft")
SIZE = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def test_ppo_refuses_prompt_learning(tokenizer):
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    policy = AutoModelForCausalLMWithValueHead.from_pretrained(build_tiny_model(tokenizer, **SIZE), peft_config=config)
    with pytest.raises(ValueError, match=r"PPOTrainer does not support prompt-learning PEFT \(PromptTuningConfig\)"):
        PPOTrainer(PPOConfig(batch_size=8, mini_batch_size=4), policy, None, tokenizer)


def test_distillation_refuses_prompt_learning(tokenizer, tmp_path):
    config = peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    student, teacher = build_tiny_model(tokenizer, **SIZE), build_tiny_model(tokenizer, seed=1, **SIZE)
    with pytest.raises(ValueError, match=r"DistillationTrainer .*\(PrefixTuningConfig\).*peft.LoraConfig"):
        DistillationTrainer(
            student, teacher, args=dist_args(tmp_path), train_dataset=prompt_dataset(8), processing_class=tokenizer,
            peft_config=config,
        )  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [
        peft.PromptEncoderConfig(task_type="SEQ_CLS", num_virtual_tokens=4, encoder_hidden_size=16),
        peft.PrefixTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=4),
    ],
    ids=["p_tuning", "prefix_tuning"],
)
def test_reward_refuses_prompt_learning(tokenizer, tmp_path, config):
    data = preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(16))
    model = build_tiny_sequence_classifier(tokenizer, **SIZE)
    name = type(config).__name__
    with pytest.raises(ValueError, match=rf"RewardTrainer .*\({name}\).*last real token"):
        RewardTrainer(model, args=rm_args(tmp_path), train_dataset=data, processing_class=tokenizer, peft_config=config)
