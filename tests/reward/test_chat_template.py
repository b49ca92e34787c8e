"""Reward's `chat_template_path` given a tokenizer folder: TRL 1.16's clone (template, tokens, EOS, embeddings)."""

import pytest
import torch
from datasets import Dataset

from replayrl.models.tiny import build_tokenizer
from replayrl.reward import RewardTrainer
from tests.data.chat import END_OF_TURN, SOURCE_TEMPLATE, THINK, conversation, save_source_tokenizer
from tests.reward.test_trainer import classifier, rm_args

ROWS = [{"chosen": conversation(f"q{i}", "yes" * (1 + i % 2)), "rejected": conversation(f"q{i}", "no")}
        for i in range(4)]  # fmt: skip


def cloned_trainer(tmp_path, **kwargs):
    tok = build_tokenizer()
    args = rm_args(tmp_path, chat_template_path=save_source_tokenizer(tmp_path / "src"), per_device_train_batch_size=4)
    model = classifier(tok)
    trainer = RewardTrainer(model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok, **kwargs)
    return trainer, tok


def test_a_tokenizer_folder_is_cloned_and_trained_on(tmp_path):
    trainer, tok = cloned_trainer(tmp_path)
    model = trainer.model
    assert tok.chat_template == SOURCE_TEMPLATE and tok.eos_token == END_OF_TURN
    assert len(tok) == 128 == model.get_input_embeddings().weight.shape[0]
    assert model.config.eos_token_id == tok.convert_tokens_to_ids(END_OF_TURN) == 101
    assert tok.decode(trainer.train_dataset[0]["chosen_ids"]) == f"[u]q0{END_OF_TURN}[a]{THINK}yes{END_OF_TURN}"
    before = model.get_input_embeddings().weight[101:103].detach().clone()
    trainer.train()
    assert not torch.allclose(model.get_input_embeddings().weight[101:103], before)


def test_with_lora_the_added_token_rows_train(tmp_path):
    """The added ids join trainable_token_indices; a sequence classifier has no lm_head to save."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS")
    trainer, tok = cloned_trainer(tmp_path, peft_config=config)
    assert config.trainable_token_indices == {"embed_tokens": list(range(101, 128))}
    assert config.modules_to_save == ["classifier", "score"]  # PEFT's SEQ_CLS default, no lm_head added
    embed = trainer.model.get_input_embeddings()
    ids = torch.tensor([101, 102, 5])
    before = embed(ids).detach().clone()
    trainer.train()
    after = embed(ids).detach()
    assert not torch.allclose(after[:2], before[:2])
    torch.testing.assert_close(after[2], before[2])
