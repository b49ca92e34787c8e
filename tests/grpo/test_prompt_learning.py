"""GRPO with prompt-learning PEFT: trains on transformers' generate(); refused with the backends that cannot
sample with a soft prompt (vLLM, continuous batching)."""

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from tests.conftest import tiny_args
from tests.grpo.test_trainer import varied_reward

peft = pytest.importorskip("peft")


@pytest.mark.parametrize("config_cls, trainer_cls", [(GRPOConfig, GRPOTrainer), (RLOOConfig, RLOOTrainer)])
def test_prompt_tuning_trains_the_soft_prompt(model, tokenizer, dataset, tmp_path, config_cls, trainer_cls):
    args = tiny_args(config_cls, tmp_path, beta=0.1, max_steps=2, learning_rate=1e-1)
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    trainer = trainer_cls(
        model=model, reward_funcs=varied_reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        peft_config=config,
    )  # fmt: skip
    prompt = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert prompt and all(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in prompt.items())
    assert "kl" in trainer.state.log_history[0]


def test_backends_without_the_soft_prompt_are_refused(model, tokenizer, dataset, tmp_path):
    # (use_vllm=True takes the same check; without vLLM installed the config refuses it first)
    args = tiny_args(GRPOConfig, tmp_path, use_transformers_continuous_batching=True)
    config = peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    with pytest.raises(ValueError, match=r"GRPOTrainer with use_vllm=True .*\(PrefixTuningConfig\).*generate\(\)"):
        GRPOTrainer(
            model=model, reward_funcs=varied_reward, args=args, train_dataset=dataset, processing_class=tokenizer,
            peft_config=config,
        )  # fmt: skip
