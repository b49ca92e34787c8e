import pytest
from datasets import Dataset

from replayrl.data.formats import DatasetFormat, check_sft_format, dataset_format, detect_format

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
PROMPT = [{"role": "user", "content": "hi"}]
ANSWER = [{"role": "assistant", "content": "yo"}]


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"text": "a b c"}, DatasetFormat("language_modeling", False, "text")),
        ({"text": CHAT}, DatasetFormat("language_modeling", True, "text")),
        ({"messages": CHAT}, DatasetFormat("language_modeling", True, "messages")),
        ({"prompt": "1+1=", "completion": "2"}, DatasetFormat("prompt_completion", False)),
        ({"prompt": PROMPT, "completion": ANSWER}, DatasetFormat("prompt_completion", True)),
        ({"prompt": "1+1="}, DatasetFormat("prompt_only", False)),
        ({"prompt": PROMPT}, DatasetFormat("prompt_only", True)),
        ({"prompt": "q", "chosen": "a", "rejected": "b"}, DatasetFormat("preference", False)),
        ({"chosen": CHAT, "rejected": CHAT}, DatasetFormat("preference", True, implicit_prompt=True)),
        ({"input_ids": [1, 2, 3]}, DatasetFormat("tokenized", False)),
    ],
)
def test_each_format_is_detected(row, expected):
    assert detect_format(list(row), row) == expected
    assert dataset_format(Dataset.from_list([row])) == expected


def test_custom_text_field():
    fmt = detect_format(["content", "id"], {"content": "x", "id": 1}, dataset_text_field="content")
    assert fmt == DatasetFormat("language_modeling", False, "content")


def test_unknown_columns_are_named_in_the_error():
    with pytest.raises(ValueError, match=r"\['answer', 'question'\].*dataset_text_field"):
        detect_format(["question", "answer"], {"question": "q", "answer": "a"})


def test_preference_data_is_refused_by_sft_with_the_trainers_to_use():
    fmt = detect_format(["chosen", "rejected"], {"chosen": "a", "rejected": "b"})
    with pytest.raises(ValueError, match="preference dataset.*DPOTrainer or RewardTrainer"):
        check_sft_format(fmt)


def test_prompt_only_is_refused_by_sft():
    with pytest.raises(ValueError, match="prompt-only.*completion"):
        check_sft_format(detect_format(["prompt"], {"prompt": "q"}))


def test_assistant_only_loss_needs_conversational_data():
    fmt = detect_format(["text"], {"text": "plain"})
    check_sft_format(fmt)  # fine without assistant_only_loss
    with pytest.raises(ValueError, match="assistant_only_loss=True needs conversational data"):
        check_sft_format(fmt, assistant_only_loss=True)
