"""SFT's `chat_template_path` given a tokenizer folder: TRL 1.16's clone (template, tokens, EOS, embeddings)."""

import pytest
import torch

from replayrl import SFTTrainer
from replayrl.models.tiny import build_tokenizer
from tests.data.chat import END_OF_TURN, SOURCE_TEMPLATE, THINK, save_source_tokenizer
from tests.sft.helpers import record, sft_args, trained_texts
from tests.sft.test_trainer import chat_dataset, tiny


def cloned_trainer(tmp_path, **kwargs):
    tok = build_tokenizer()
    args = sft_args(tmp_path, chat_template_path=save_source_tokenizer(tmp_path / "src"), max_steps=1)
    return SFTTrainer(tiny(tok), args=args, train_dataset=chat_dataset(), processing_class=tok, **kwargs), tok


def test_a_tokenizer_folder_is_cloned_and_trained_on(tmp_path):
    trainer, tok = cloned_trainer(tmp_path)
    model = trainer.model
    assert tok.chat_template == SOURCE_TEMPLATE and tok.eos_token == END_OF_TURN
    assert len(tok) == 128 == model.get_input_embeddings().weight.shape[0]
    eos = tok.convert_tokens_to_ids(END_OF_TURN)
    assert model.config.eos_token_id == model.generation_config.eos_token_id == eos == 101
    first = trainer.train_dataset[0]["input_ids"]
    assert tok.decode(first) == f"[u]add 0 and 1{END_OF_TURN}[a]{THINK}1{END_OF_TURN}"
    new_rows = [eos, tok.convert_tokens_to_ids(THINK)]
    before = model.get_input_embeddings().weight[new_rows].detach().clone()
    recorder = record(trainer)
    trainer.train()
    assert all(f"[a]{THINK}" in t and t.endswith(END_OF_TURN) for t in trained_texts(tok, recorder.batches[0]))
    assert not torch.allclose(model.get_input_embeddings().weight[new_rows], before)


def test_with_lora_the_added_token_rows_train(tmp_path):
    """TRL 1.16: the added ids join trainable_token_indices['embed_tokens']. The tiny model ties its head to the
    embeddings, so lm_head stays out of modules_to_save (PEFT's tied trainable tokens update it)."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer, tok = cloned_trainer(tmp_path, peft_config=config)
    new_ids = list(range(101, 128))  # the two source tokens, then the dummies that round 103 up to 128
    assert config.trainable_token_indices == {"embed_tokens": new_ids} and config.modules_to_save is None
    embed = trainer.model.get_input_embeddings()
    ids = torch.tensor([tok.convert_tokens_to_ids(END_OF_TURN), tok.convert_tokens_to_ids(THINK), 5])
    before = embed(ids).detach().clone()
    trainer.train()
    after = embed(ids).detach()
    assert not torch.allclose(after[0], before[0]) and not torch.allclose(after[1], before[1])
    torch.testing.assert_close(after[2], before[2])  # an old token's row stays frozen


def test_with_lora_an_untied_head_is_saved_whole(tmp_path):
    """An untied lm_head joins modules_to_save (TRL 1.16), so the model learns to emit the new tokens."""
    peft = pytest.importorskip("peft")
    tok = build_tokenizer()
    model = tiny(tok)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = sft_args(tmp_path, chat_template_path=save_source_tokenizer(tmp_path / "src"), max_steps=1)
    trainer = SFTTrainer(model, args=args, train_dataset=chat_dataset(), processing_class=tok, peft_config=config)
    assert config.modules_to_save == ["lm_head"]
    head = trainer.model.get_output_embeddings()
    eos = tok.convert_tokens_to_ids(END_OF_TURN)
    assert head.weight.shape[0] == 128
    before = head.weight[eos].detach().clone()
    trainer.train()
    assert not torch.allclose(trainer.model.get_output_embeddings().weight[eos], before)
