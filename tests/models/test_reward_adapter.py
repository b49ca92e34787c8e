"""TRL v0.7.1's reward-modeling adapter: a PEFT reward model on the policy's base loaded as a second adapter of
the PEFT value-head policy (`from_pretrained(..., reward_adapter=folder)`), read by `compute_reward_score`."""

import pytest
import torch

from replayrl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

peft = pytest.importorskip("peft")
IDS = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])


def _reward_model_folder(model_dir, tmp_path):
    """A LoRA sequence classifier on the tiny base, trained one step (so its LoRA weights are not zero)."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    rm = peft.get_peft_model(rm, peft.LoraConfig(r=4, lora_alpha=8, task_type="SEQ_CLS"))
    optim = torch.optim.Adam([p for p in rm.parameters() if p.requires_grad], lr=1e-2)
    rm(IDS).logits.mean().backward()
    optim.step()
    rm.eval()
    rm.save_pretrained(tmp_path / "rm")
    return tmp_path / "rm", rm(IDS).logits.detach()


def test_reward_adapter_scores_as_the_reward_model_and_stays_frozen_through_ppo(model_dir, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    folder, rm_logits = _reward_model_folder(model_dir, tmp_path)
    policy = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), peft.LoraConfig(r=4, lora_alpha=8))
    model = AutoModelForCausalLMWithValueHead.from_pretrained(policy, reward_adapter=str(folder))
    scores = model.compute_reward_score(IDS)
    assert scores.shape == (2, 5, 1)
    torch.testing.assert_close(scores[:, -1, :], rm_logits, rtol=1e-5, atol=1e-5)  # last token: the RM's logit
    assert policy.active_adapters == ["default"] and not scores.requires_grad
    with pytest.warns(UserWarning, match="No dataset"):
        trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1, learning_rate=1e-2), model, None, tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.step([IDS[0], IDS[1]], [torch.tensor([20, 21, 22])] * 2, [1.0, -1.0])
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert any("lora_A.default" in n for n in changed) and any("v_head" in n for n in changed)
    assert not any("reward_model_adapter" in n or n.startswith("score.") for n in changed)
    torch.testing.assert_close(model.compute_reward_score(IDS)[:, -1, :], rm_logits, rtol=1e-5, atol=1e-5)


def test_reward_adapter_needs_a_peft_policy_and_an_adapter_folder(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match="reward_adapter needs a PEFT policy"):
        AutoModelForCausalLMWithValueHead.from_pretrained(model_dir, reward_adapter=str(tmp_path))
    policy = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), peft.LoraConfig(r=4))
    with pytest.raises(ValueError, match="holds no adapter_config.json"):
        AutoModelForCausalLMWithValueHead.from_pretrained(policy, reward_adapter=str(tmp_path))
    with pytest.raises(ValueError, match="compute_reward_score needs a reward adapter"):
        AutoModelForCausalLMWithValueHead.from_pretrained(policy).compute_reward_score(IDS)
