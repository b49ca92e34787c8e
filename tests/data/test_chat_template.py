"""`clone_chat_template` (TRL 1.16's): template, added tokens, EOS and embeddings from another tokenizer."""

import pytest
import torch

from replayrl import clone_chat_template
from replayrl.models.tiny import build_tiny_model, build_tiny_sequence_classifier, build_tokenizer
from tests.data.chat import END_OF_TURN, SOURCE_TEMPLATE, THINK, save_source_tokenizer


def test_clone_copies_template_tokens_and_eos_and_pads_embeddings_to_64(tmp_path):
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer)
    old_size, old_rows = len(tokenizer), model.get_input_embeddings().weight.detach().clone()
    assert old_size == 101 and END_OF_TURN not in tokenizer.get_vocab()
    model, tokenizer, added = clone_chat_template(model, tokenizer, save_source_tokenizer(tmp_path / "src"))

    assert tokenizer.chat_template == SOURCE_TEMPLATE
    assert len(tokenizer) == 128 == model.get_input_embeddings().weight.shape[0] == model.config.vocab_size
    assert tokenizer.convert_ids_to_tokens(added[:2]) == [END_OF_TURN, THINK]
    assert added == list(range(old_size, 128))  # the two source tokens, then 25 dummy <extra_id_N>
    assert tokenizer.convert_ids_to_tokens(added[-1]) == "<extra_id_24>"
    assert tokenizer.eos_token == END_OF_TURN
    assert model.config.eos_token_id == model.generation_config.eos_token_id == tokenizer.eos_token_id == old_size
    torch.testing.assert_close(model.get_input_embeddings().weight[:old_size], old_rows)  # old rows untouched
    text = f"[a]{THINK}hi{END_OF_TURN}"
    assert tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])[-1] == END_OF_TURN
    assert model(torch.tensor([tokenizer(text)["input_ids"]])).logits.shape[-1] == 128


def test_clone_without_rounding_and_onto_a_sequence_classifier(tmp_path):
    """resize_to_multiple_of=None: exactly the new vocabulary. A reward model cannot generate (no generation
    config to update); its config's EOS is still mirrored."""
    tokenizer = build_tokenizer()
    model = build_tiny_sequence_classifier(tokenizer)
    model, tokenizer, added = clone_chat_template(model, tokenizer, save_source_tokenizer(tmp_path / "src"), None)
    assert len(added) == 2 and len(tokenizer) == 103 == model.get_input_embeddings().weight.shape[0]
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids(END_OF_TURN)


def test_clone_needs_a_tokenizer_with_a_template(tmp_path):
    tokenizer, model = build_tokenizer(), None
    source = build_tokenizer()
    source.chat_template = None
    source.save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="no chat template"):
        clone_chat_template(model, tokenizer, str(tmp_path / "bare"))
    with pytest.raises(ValueError, match="neither a template file nor a tokenizer folder"):
        clone_chat_template(model, tokenizer, str(tmp_path / "missing"))
