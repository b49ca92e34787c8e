"""KTO with prompt tuning: completion log-probs over the real tokens only, and train() updates the soft prompt."""

import pytest
import torch

from replayrl import KTOTrainer
from replayrl.kto.trainer import completion_logps
from replayrl.models.tiny import build_tiny_model
from replayrl.tasks.preferences import preference_datasets
from tests.kto.test_trainer import kto_args

peft = pytest.importorskip("peft")


def test_completion_logps_and_training_with_prompt_tuning(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    args = kto_args(tmp_path, learning_rate=1e-1)
    data = preference_datasets(0, per_problem=1)[0]
    trainer = KTOTrainer(model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=config)
    prompt = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert prompt and all(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in prompt.items())
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        got, _ = completion_logps(trainer.model.eval(), batch)
        # the slow obvious way: the PEFT model's full logits, without the 4 virtual positions in front
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 4:-1]
    targets, mask = batch["input_ids"][:, 1:], batch["completion_mask"][:, 1:]
    want = (torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask).sum(1)
    torch.testing.assert_close(got, want)
