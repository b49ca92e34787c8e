"""DPO with prompt-learning PEFT (prompt tuning, p-tuning): the virtual tokens' positions are not scored.

The sequence log-probs must be those of the PEFT model's own logits at the real tokens (`logits[:, v:]`), and the
reference (the adapter switched off) those of the untouched base model.
"""

import pytest
import torch

from replayrl.dpo import DPOTrainer
from replayrl.tasks.preferences import preference_datasets
from tests.dpo.test_trainer import dpo_args, first_batch, tiny

peft = pytest.importorskip("peft")
V = 4  # virtual tokens


def sequence_logps(model, batch, virtual: int) -> torch.Tensor:
    """Summed completion log-probs of the 2B rows (chosen first) from the full logits, the slow obvious way."""
    rows = {}
    for key, fill in (("input_ids", 0), ("attention_mask", 0), ("labels", -100)):
        parts = [batch[f"{side}_{key}"] for side in ("chosen", "rejected")]
        width = max(p.shape[1] for p in parts)
        rows[key] = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts])
    logits = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits[:, virtual:]
    targets = rows["labels"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (logp * (targets != -100)).sum(1)


@pytest.mark.parametrize(
    "config",
    [
        peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=V),
        peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=V, encoder_hidden_size=16),
    ],
    ids=["prompt_tuning", "p_tuning"],
)
def test_policy_and_reference_logps_skip_the_virtual_tokens(tokenizer, tmp_path, config):
    data = preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(8))
    args = dpo_args(tmp_path, max_steps=2, learning_rate=5e-2)  # prefix sharing on: it falls back to two rows
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=data, processing_class=tokenizer, peft_config=config)
    trainer.train()
    model = trainer.model.eval()
    batch = first_batch(trainer)
    with torch.no_grad():
        chosen, rejected, _, _ = trainer.concatenated_forward(model, batch)
        torch.testing.assert_close(torch.cat([chosen, rejected]), sequence_logps(model, batch, V))
        ref_chosen, ref_rejected = trainer.compute_ref_log_probs(batch)
        base = sequence_logps(tiny(tokenizer), batch, 0)  # the adapter off is the untouched base model
        torch.testing.assert_close(torch.cat([ref_chosen, ref_rejected]), base)


def test_padding_free_is_refused_with_prompt_learning(tokenizer, tmp_path):
    data = preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(8))
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=V)
    with pytest.raises(ValueError, match=r"DPOTrainer with padding_free=True .*PromptTuningConfig.*padding_free=False"):
        DPOTrainer(
            tiny(tokenizer),
            args=dpo_args(tmp_path, padding_free=True),
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=config,
        )
