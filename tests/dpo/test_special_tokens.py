"""DPO's prepared ids are TRL 1.16's with a Llama-style tokenizer (a BOS): text prompts get the tokenizer's special
tokens (BOS first), text completions EOS once; conversations take the chat template's own BOS (not a second one) and
end with the template's turn end, no EOS. Ids hand-checked against the tiny vocabulary (`replayrl.models.tiny`:
specials 0-3, letters from 4, digits from 56, punctuation from 66, BOS `<s>` = 101). scripts/
compare_preference_tokens.py checks the same against TRL 1.16 itself."""

from datasets import Dataset

from replayrl.dpo import DPOTrainer
from tests.dpo.test_trainer import dpo_args, tiny

BOS, EOS, IM_START, IM_END, NL = 101, 1, 2, 3, 99
ONE_PLUS_TWO = [57, 76, 58, 84]  # "1+2="
USER, ASSISTANT, Q, YES, NO = [24, 22, 8, 21], [4, 22, 22, 12, 22, 23, 4, 17, 23], [20], [28, 8, 22], [17, 18]


def train_one_step(tokenizer, rows: dict, tmp_path) -> DPOTrainer:
    args = dpo_args(tmp_path, per_device_train_batch_size=2)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=Dataset.from_dict(rows), processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 1
    return trainer


def test_text_prompt_starts_with_bos_and_completions_end_with_eos(bos_tokenizer, tmp_path):
    rows = {"prompt": ["1+2="] * 2, "chosen": ["3", "3<|endoftext|>"], "rejected": ["4"] * 2}
    trainer = train_one_step(bos_tokenizer, rows, tmp_path)
    for row in trainer.train_dataset:
        assert row["prompt_ids"] == [BOS, *ONE_PLUS_TWO]
        assert (row["chosen_ids"], row["rejected_ids"]) == ([59, EOS], [60, EOS])  # "3" / "4", EOS once
    batch = trainer.data_collator([trainer.train_dataset[0]])
    assert batch["chosen_input_ids"].tolist() == [[BOS, *ONE_PLUS_TWO, 59, EOS]]  # what the policy and reference see
    assert batch["chosen_labels"].tolist() == [[-100] * 5 + [59, EOS]]


def test_conversation_takes_the_templates_bos_once_and_no_eos(bos_tokenizer, tmp_path):
    prompt = [{"role": "user", "content": "q"}]
    rows = {"prompt": [prompt] * 2, "chosen": [[{"role": "assistant", "content": "yes"}]] * 2,
            "rejected": [[{"role": "assistant", "content": "no"}]] * 2}  # fmt: skip
    row = train_one_step(bos_tokenizer, rows, tmp_path).train_dataset[0]
    assert row["prompt_ids"] == [BOS, IM_START, *USER, NL, *Q, IM_END, NL, IM_START, *ASSISTANT, NL]
    assert (row["chosen_ids"], row["rejected_ids"]) == ([*YES, IM_END, NL], [*NO, IM_END, NL])


def test_no_bos_tokenizer_adds_nothing(tokenizer, tmp_path):
    """Qwen-style: no BOS, so the prompt is its text's ids alone (what replayrl did before, unchanged for Qwen)."""
    rows = {"prompt": ["1+2="] * 2, "chosen": ["3"] * 2, "rejected": ["4"] * 2}
    row = train_one_step(tokenizer, rows, tmp_path).train_dataset[0]
    assert (row["prompt_ids"], row["chosen_ids"]) == (ONE_PLUS_TWO, [59, EOS])
