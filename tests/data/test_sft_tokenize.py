import pytest
import torch
from datasets import Dataset

from replayrl.data.chat_template import load_chat_template
from replayrl.data.collators import SFTDataCollator
from replayrl.data.formats import dataset_format, detect_format
from replayrl.data.sft import (
    SFTTokenizeSettings,
    apply_formatting_func,
    check_chat_template,
    prepare_sft_dataset,
    resolve_eos_token_id,
    tokenize_row,
    truncate_row,
)
from replayrl.models.tiny import EOS, build_tokenizer
from tests.data.chat import GENERATION_TEMPLATE, chat_tokenizer, conversation


@pytest.fixture
def tok():
    return build_tokenizer()


def settings(tok, **kw):
    return SFTTokenizeSettings(eos_token_id=tok.eos_token_id, **kw)


def ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def test_eos_is_appended_exactly_once(tok):
    fmt = detect_format(["text"], None)
    plain = tokenize_row({"text": "abc"}, tok, fmt, settings(tok))["input_ids"]
    already = tokenize_row({"text": "abc" + EOS}, tok, fmt, settings(tok))["input_ids"]
    assert plain == already == ids(tok, "abc") + [tok.eos_token_id]


def test_eos_survives_when_pad_equals_eos(tok):
    tok.pad_token = tok.eos_token
    fmt = detect_format(["text"], None)
    rows = [tokenize_row({"text": t}, tok, fmt, settings(tok)) for t in ("ab", "abcd")]
    batch = SFTDataCollator(pad_token_id=tok.pad_token_id)(rows)
    eos = tok.eos_token_id
    # the short row: 'a' 'b' EOS then two pads (also EOS): the real EOS is trained on, the pads are not
    assert batch["input_ids"][0].tolist() == ids(tok, "ab") + [eos, eos, eos]
    assert batch["labels"][0].tolist() == [-100, ids(tok, "b")[0], eos, -100, -100]
    assert batch["attention_mask"][0].tolist() == [1, 1, 1, 0, 0]
    assert batch["labels"][1, -1].item() == eos


def test_custom_eos_token(tok):
    assert resolve_eos_token_id(tok, "<|im_end|>") == tok.convert_tokens_to_ids("<|im_end|>")
    with pytest.raises(ValueError, match="not a token"):
        resolve_eos_token_id(tok, "<|no_such_token|>")


def test_prompt_completion_mask_covers_the_completion_and_eos(tok):
    fmt = detect_format(["prompt", "completion"], None)
    row = tokenize_row({"prompt": "3+4=", "completion": "7"}, tok, fmt, settings(tok))
    assert row["input_ids"] == ids(tok, "3+4=7") + [tok.eos_token_id]
    assert row["completion_mask"] == [0, 0, 0, 0, 1, 1]


def test_conversational_prompt_completion_mask(tok):
    fmt = detect_format(["prompt", "completion"], {"prompt": conversation("q", "a")[:1]})
    example = {"prompt": conversation("q", "a")[:1], "completion": conversation("q", "a")[1:]}
    row = tokenize_row(example, tok, fmt, settings(tok))
    trained = [t for t, m in zip(row["input_ids"], row["completion_mask"]) if m]
    assert tok.decode(trained) == "a<|im_end|>\n"


def test_assistant_masks_cover_exactly_the_assistant_text():
    tok = chat_tokenizer()
    fmt = detect_format(["messages"], {"messages": conversation("hi", "yo")})
    messages = conversation("hi", "yo") + conversation("more", "ok")
    row = tokenize_row({"messages": messages}, tok, fmt, settings(tok, assistant_only_loss=True))
    trained = [t for t, m in zip(row["input_ids"], row["assistant_masks"]) if m]
    assert tok.decode(trained) == "yo<|im_end|>ok<|im_end|>"


def test_template_without_generation_marks_raises_for_assistant_only_loss(tok):
    fmt = detect_format(["messages"], {"messages": conversation("hi", "yo")})
    check_chat_template(tok, fmt, assistant_only_loss=False)  # the tiny ChatML template is fine otherwise
    with pytest.raises(ValueError, match="no \\{% generation %\\}"):
        check_chat_template(tok, fmt, assistant_only_loss=True)
    check_chat_template(chat_tokenizer(), fmt, assistant_only_loss=True)


def test_conversational_data_needs_a_chat_template():
    fmt = detect_format(["messages"], {"messages": conversation("hi", "yo")})
    with pytest.raises(ValueError, match="no chat template.*chat_template_path"):
        check_chat_template(chat_tokenizer(None), fmt, assistant_only_loss=False)


def test_chat_template_path_file(tok, tmp_path):
    """A template file; a tokenizer folder is cloned (tests/data/test_chat_template.py)."""
    file = tmp_path / "template.jinja"
    file.write_text(GENERATION_TEMPLATE)
    load_chat_template(tok, str(file))
    assert tok.chat_template == GENERATION_TEMPLATE
    with pytest.raises(ValueError, match="neither a template file nor a tokenizer folder"):
        load_chat_template(tok, str(tmp_path / "missing.jinja"))


def test_truncation_keep_start_and_keep_end():
    row = {"input_ids": [1, 2, 3, 4, 5], "completion_mask": [0, 0, 1, 1, 1]}
    assert truncate_row(row, 3, "keep_start") == ({"input_ids": [1, 2, 3], "completion_mask": [0, 0, 1]}, True)
    assert truncate_row(row, 3, "keep_end") == ({"input_ids": [3, 4, 5], "completion_mask": [1, 1, 1]}, True)
    assert truncate_row(row, 5, "keep_end") == (row, False)


def test_a_row_with_nothing_to_train_on_raises_unless_truncated_then_it_is_dropped(caplog):
    tok = chat_tokenizer()
    data = Dataset.from_list([{"messages": conversation("hi", "yo")}, {"messages": conversation("hi", "x")[:1]}])
    fmt = dataset_format(data)
    with pytest.raises(ValueError, match="Row 1 of the dataset has no token to train on"):
        prepare_sft_dataset(data, tok, fmt, settings(tok, assistant_only_loss=True), completion_only_loss=True)
    # cut before the completion by truncation: dropped, as TRL 1.16 (it would add no loss), with a warning
    data = Dataset.from_list([{"prompt": "a long prompt", "completion": "x"}, {"prompt": "1+", "completion": "1"}])
    out = prepare_sft_dataset(data, tok, dataset_format(data), settings(tok, max_length=4), completion_only_loss=True)
    assert [tok.decode(row) for row in out["input_ids"]] == ["1+1" + tok.eos_token]
    assert out["labels"] == [[-100, -100, *out["input_ids"][0][2:]]]  # the completion mask baked into labels
    assert "dropped 1 of 2 rows" in caplog.text.lower()
    with pytest.raises(ValueError, match="left no row with a token to train on"):
        prepare_sft_dataset(data.select([0]), tok, dataset_format(data), settings(tok, max_length=4), True)


def test_formatting_func_per_example_and_seed_batched(tok):
    data = Dataset.from_dict({"q": ["1+1", "2+2"], "a": ["2", "4"]})
    per_row = apply_formatting_func(data, lambda ex: f"{ex['q']}={ex['a']}", None)
    batched = apply_formatting_func(
        data, lambda b: [f"{q}={a}" for q, a in zip(b["q"], b["a"])], None
    )  # TRL v0.7.1's style: a batch in, a list of strings out
    assert per_row["text"] == batched["text"] == ["1+1=2", "2+2=4"]
    with pytest.raises(ValueError, match="must return a str"):
        apply_formatting_func(data, lambda ex: 3, None)


def test_prepare_packs_into_rows_of_max_length(tok):
    data = Dataset.from_dict({"text": ["a" * n for n in (7, 5, 3, 2, 1)]})
    out = prepare_sft_dataset(
        data, tok, dataset_format(data), settings(tok, max_length=10), completion_only_loss=True, packing=True
    )
    lengths = [n for row in out["seq_lengths"] for n in row]
    assert sorted(lengths) == [2, 3, 4, 6, 8]  # each document + its EOS, none split
    assert all(len(row) <= 10 and sum(s) == len(row) for row, s in zip(out["input_ids"], out["seq_lengths"]))
    assert len(out) == 3  # 8+2, 6+4, 3
    assert torch.tensor(out[0]["input_ids"]).numel() == 10
