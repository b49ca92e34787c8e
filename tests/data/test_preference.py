"""Preference data: implicit prompts, tokenisation, truncation, collators, format errors."""

import pytest
import torch

from replayrl.data.preference import (
    DPODataCollator,
    RewardDataCollatorWithPadding,
    dataset_kind,
    extract_prompt,
    tokenize_dpo_row,
    tokenize_reward_row,
    truncate_pair,
)


def chat(role, text):
    return {"role": role, "content": text}


def test_implicit_prompt_text_leaves_the_space_to_the_completion():
    row = extract_prompt({"chosen": "The sky is blue", "rejected": "The sky is green"})
    assert (row["prompt"], row["chosen"], row["rejected"]) == ("The sky is", " blue", " green")
    row = extract_prompt({"chosen": "3+4=7", "rejected": "3+4=8"})
    assert (row["prompt"], row["chosen"], row["rejected"]) == ("3+4=", "7", "8")


def test_implicit_prompt_conversational_splits_whole_messages():
    user = chat("user", "hi")
    row = extract_prompt({"chosen": [user, chat("assistant", "hello")], "rejected": [user, chat("assistant", "go")]})
    assert row["prompt"] == [user]
    assert row["chosen"] == [chat("assistant", "hello")]


def test_explicit_prompt_is_kept_and_bad_implicit_raises():
    row = {"prompt": "p", "chosen": "a", "rejected": "b"}
    assert extract_prompt(row) is row
    with pytest.raises(ValueError, match="share a non-empty prefix"):
        extract_prompt({"chosen": "abc", "rejected": "xyz"})


def test_tokenize_dpo_row_text(tokenizer):
    out = tokenize_dpo_row({"prompt": "1+2=", "chosen": "3", "rejected": "4"}, tokenizer)
    assert tokenizer.decode(out["prompt_ids"]) == "1+2="
    assert out["chosen_ids"] == tokenizer("3").input_ids + [tokenizer.eos_token_id]  # EOS once
    out = tokenize_dpo_row({"prompt": "1+2=", "chosen": "3<|endoftext|>", "rejected": "4"}, tokenizer)
    assert out["chosen_ids"].count(tokenizer.eos_token_id) == 1
    out = tokenize_dpo_row(
        {"prompt": "12345", "chosen": "abcdef", "rejected": "x"},
        tokenizer,
        max_prompt_length=2,
        max_completion_length=3,
    )
    assert tokenizer.decode(out["prompt_ids"]) == "45"  # the prompt's end is kept
    assert tokenizer.decode(out["chosen_ids"]) == "abc"


def test_tokenize_dpo_row_conversational(tokenizer):
    row = {"prompt": [chat("user", "q")], "chosen": [chat("assistant", "yes")], "rejected": [chat("assistant", "no")]}
    out = tokenize_dpo_row(row, tokenizer)
    assert tokenizer.decode(out["prompt_ids"]) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(out["rejected_ids"]) == "no<|im_end|>\n"  # as TRL 1.16: the template ends the turn, no EOS
    with pytest.raises(ValueError, match="both be conversations"):
        tokenize_dpo_row({"prompt": [chat("user", "q")], "chosen": "yes", "rejected": "no"}, tokenizer)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("keep_start", ([1, 2, 3], [4, 5])), ("keep_end", ([3], [4, 5, 6, 7]))],
)
def test_truncate_pair(mode, expected):
    assert truncate_pair([1, 2, 3], [4, 5, 6, 7], 5, mode) == expected
    assert truncate_pair([1, 2, 3], [4], 5, mode) == ([1, 2, 3], [4])
    with pytest.raises(ValueError, match="truncation_mode"):
        truncate_pair([1, 2, 3], [4, 5, 6], 2, "middle")


def test_dpo_collator_labels_only_the_completion():
    collate = DPODataCollator(pad_token_id=0, label_pad_token_id=-100)
    rows = [
        {"prompt_ids": [5, 6], "chosen_ids": [7, 1], "rejected_ids": [8], "ref_chosen_logps": -1.0,
         "ref_rejected_logps": -2.0},
        {"prompt_ids": [9], "chosen_ids": [7], "rejected_ids": [8, 8, 1], "ref_chosen_logps": -3.0,
         "ref_rejected_logps": -4.0},
    ]  # fmt: skip
    batch = collate(rows)
    assert batch["chosen_input_ids"].tolist() == [[5, 6, 7, 1], [9, 7, 0, 0]]
    assert batch["chosen_labels"].tolist() == [[-100, -100, 7, 1], [-100, 7, -100, -100]]
    assert batch["chosen_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["rejected_labels"].tolist() == [[-100, -100, 8, -100], [-100, 8, 8, 1]]
    assert batch["ref_rejected_logps"].tolist() == [-2.0, -4.0]


def test_reward_rows_and_collator(tokenizer):
    out = tokenize_reward_row({"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": 1.0}, tokenizer)
    assert tokenizer.decode(out["chosen_ids"]) == "1+1=2"  # as GRPO will score it
    with_eos = tokenize_reward_row({"prompt": "1+1=", "chosen": "2<|endoftext|>", "rejected": "3"}, tokenizer, True)
    assert tokenizer.decode(with_eos["chosen_ids"]) == "1+1=2<|endoftext|>"  # once
    assert set(out) == {"chosen_ids", "rejected_ids"}  # TRL 1.16's columns; the collator builds the masks
    implicit = tokenize_reward_row({"chosen": [chat("user", "a"), chat("assistant", "b")],
                                    "rejected": [chat("user", "a"), chat("assistant", "c")]}, tokenizer)  # fmt: skip
    assert tokenizer.decode(implicit["chosen_ids"]).endswith("b<|im_end|>\n")
    batch = RewardDataCollatorWithPadding(pad_token_id=0)(
        [{"chosen_ids": [4, 5], "rejected_ids": [6], "margin": 0.5},
         {"chosen_ids": [4], "rejected_ids": [6, 7, 8], "margin": 1.0}]
    )  # fmt: skip
    assert batch["input_ids_rejected"].tolist() == [[6, 0, 0], [6, 7, 8]]
    assert batch["attention_mask_chosen"].tolist() == [[1, 1], [1, 0]]
    assert torch.equal(batch["margin"], torch.tensor([0.5, 1.0]))


def test_dataset_kind_names_the_columns():
    assert dataset_kind(["prompt", "chosen", "rejected"]) == "preference"
    assert dataset_kind(["chosen", "rejected", "margin"]) == "preference"
    assert dataset_kind(PRE := ["chosen_ids", "rejected_ids"], allow_pretokenized=True) == "pretokenized"
    assert dataset_kind(["prompt_ids", *PRE, "prompt"]) == "tokenized"  # TRL 1.16's prepared DPO columns
    with pytest.raises(ValueError, match="not a preference dataset"):
        dataset_kind(PRE)  # the DPO trainer does not take the reward trainer's columns
    with pytest.raises(ValueError, match=r"train_dataset is not a preference dataset: it has columns \['text'\]"):
        dataset_kind(["text"], "train_dataset")


def test_prompt_not_a_prefix_of_prompt_plus_completion_splits_where_they_diverge(tokenizer, monkeypatch, caplog):
    """As TRL 1.16: a template whose generation prompt ("A:T") differs from what the full conversation renders
    ("A:" + reply) -> the prompt ids stop at the divergence (the "T" is left out), the completion starts there, and
    TRL 1.16's warning is logged once."""
    from replayrl.data import preference

    template = ("{% for m in messages %}{{ m['role'][0] + ':' + m['content'] + '\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ 'a:T' }}{% endif %}")  # fmt: skip
    monkeypatch.setattr(tokenizer, "chat_template", template)
    monkeypatch.setattr(preference, "_warned_prompt_split", False)
    row = {"prompt": [chat("user", "q")], "chosen": [chat("assistant", "yes")], "rejected": [chat("assistant", "no")]}
    with caplog.at_level("WARNING", logger="replayrl.data.preference"):
        out = tokenize_dpo_row(row, tokenizer)
        tokenize_dpo_row(row, tokenizer)
    assert tokenizer.decode(out["prompt_ids"]) == "u:q\na:"
    assert tokenizer.decode(out["chosen_ids"]) == "yes\n"
    assert tokenizer.decode(out["rejected_ids"]) == "no\n"
    warnings = [r for r in caplog.records if "not a prefix" in r.getMessage()]
    assert len(warnings) == 1 and "'T'" in warnings[0].getMessage()


def test_text_prompt_and_completion_are_tokenized_jointly_with_special_tokens(bos_tokenizer):
    """A BOS tokenizer: the prompt gets it (TRL 1.16's `tokenizer(text)`), the completion is the rest + EOS once."""
    out = tokenize_dpo_row({"prompt": "1+2=", "chosen": "3", "rejected": "4<|endoftext|>"}, bos_tokenizer)
    bos, eos = bos_tokenizer.bos_token_id, bos_tokenizer.eos_token_id
    assert out["prompt_ids"] == [bos, *bos_tokenizer("1+2=", add_special_tokens=False).input_ids]
    assert (out["chosen_ids"], out["rejected_ids"]) == ([59, eos], [60, eos])
    reward = tokenize_reward_row({"prompt": "1+2=", "chosen": "3", "rejected": "4"}, bos_tokenizer, append_eos=True)
    assert reward["chosen_ids"] == out["prompt_ids"] + [59, eos]
