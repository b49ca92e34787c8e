"""The reward trainer's prepared ids are TRL 1.16's with a Llama-style tokenizer (a BOS): text sequences get the
tokenizer's special tokens (BOS first) and, with `append_eos=True`, EOS once; conversations take the chat template's
own BOS (not a second one) and no EOS. Ids hand-checked against the tiny vocabulary (`replayrl.models.tiny`; BOS
`<s>` = 101). scripts/compare_preference_tokens.py checks the same against TRL 1.16 itself."""

import pytest
from datasets import Dataset

from replayrl.reward import RewardTrainer
from tests.reward.test_trainer import classifier, rm_args

BOS, EOS, IM_START, IM_END, NL = 101, 1, 2, 3, 99
ONE_PLUS_TWO = [57, 76, 58, 84]  # "1+2="
USER, ASSISTANT, Q, YES, NO = [24, 22, 8, 21], [4, 22, 22, 12, 22, 23, 4, 17, 23], [20], [28, 8, 22], [17, 18]


def prepared(tokenizer, rows: dict, tmp_path, **overrides) -> Dataset:
    args = rm_args(tmp_path, per_device_train_batch_size=2, **overrides)
    trainer = RewardTrainer(classifier(tokenizer), args=args, train_dataset=Dataset.from_dict(rows),
                            processing_class=tokenizer)  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1
    return trainer.train_dataset


@pytest.mark.parametrize("append_eos", [False, True])
def test_text_sequences_start_with_bos(bos_tokenizer, tmp_path, append_eos):
    rows = {"prompt": ["1+2="] * 2, "chosen": ["3"] * 2, "rejected": ["4"] * 2}
    eos = [EOS] if append_eos else []
    for row in prepared(bos_tokenizer, rows, tmp_path, append_eos=append_eos):
        assert row["chosen_ids"] == [BOS, *ONE_PLUS_TWO, 59, *eos]
        assert row["rejected_ids"] == [BOS, *ONE_PLUS_TWO, 60, *eos]


def test_conversations_take_the_templates_bos_once_and_no_eos(bos_tokenizer, tmp_path):
    user = {"role": "user", "content": "q"}
    rows = {"chosen": [[user, {"role": "assistant", "content": "yes"}]] * 2,
            "rejected": [[user, {"role": "assistant", "content": "no"}]] * 2}  # fmt: skip
    row = prepared(bos_tokenizer, rows, tmp_path, append_eos=True)[0]
    head = [BOS, IM_START, *USER, NL, *Q, IM_END, NL, IM_START, *ASSISTANT, NL]
    assert (row["chosen_ids"], row["rejected_ids"]) == ([*head, *YES, IM_END, NL], [*head, *NO, IM_END, NL])
