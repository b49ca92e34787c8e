"""KTO's prepared ids are TRL 1.16's with a Llama-style tokenizer (a BOS): text prompts get the tokenizer's special
tokens (BOS first), text completions EOS once; conversations take the chat template's own BOS and end with the
template's turn end, no EOS. Ids hand-checked against the tiny vocabulary (`replayrl.models.tiny`; BOS `<s>` = 101).
scripts/compare_preference_tokens.py checks the same against TRL 1.16 itself."""

from datasets import Dataset

from replayrl.kto import KTOTrainer
from replayrl.models.tiny import build_tiny_model
from tests.kto.test_trainer import kto_args

BOS, EOS, IM_START, IM_END, NL = 101, 1, 2, 3, 99
ONE_PLUS_TWO = [57, 76, 58, 84]  # "1+2="
USER, ASSISTANT, Q, YES = [24, 22, 8, 21], [4, 22, 22, 12, 22, 23, 4, 17, 23], [20], [28, 8, 22]


def prepared(tokenizer, rows: dict, tmp_path) -> Dataset:
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = kto_args(tmp_path, per_device_train_batch_size=2, max_steps=1)
    trainer = KTOTrainer(model, args=args, train_dataset=Dataset.from_dict(rows), processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 1
    return trainer.train_dataset


def test_text_prompt_starts_with_bos_and_completion_ends_with_eos(bos_tokenizer, tmp_path):
    rows = {"prompt": ["1+2="] * 2, "completion": ["3", "4<|endoftext|>"], "label": [True, False]}
    data = prepared(bos_tokenizer, rows, tmp_path)
    assert data["prompt_ids"] == [[BOS, *ONE_PLUS_TWO]] * 2
    assert data["completion_ids"] == [[59, EOS], [60, EOS]]  # EOS once


def test_conversation_takes_the_templates_bos_once_and_no_eos(bos_tokenizer, tmp_path):
    prompt = [{"role": "user", "content": "q"}]
    rows = {"prompt": [prompt] * 2, "completion": [[{"role": "assistant", "content": "yes"}]] * 2,
            "label": [True, False]}  # fmt: skip
    row = prepared(bos_tokenizer, rows, tmp_path)[0]
    assert row["prompt_ids"] == [BOS, IM_START, *USER, NL, *Q, IM_END, NL, IM_START, *ASSISTANT, NL]
    assert row["completion_ids"] == [*YES, IM_END, NL]
