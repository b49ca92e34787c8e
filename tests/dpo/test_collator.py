"""TRL 1.16's DPO collator (`replayrl.dpo.DataCollatorForPreference`): prompt + chosen rows, then prompt + rejected."""

import torch

from replayrl.dpo import DataCollatorForPreference


def test_rows_masks_and_reference_logps():
    collator = DataCollatorForPreference(pad_token_id=0, pad_to_multiple_of=3)
    batch = collator(
        [
            {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5], "ref_chosen_logps": -1.0,
             "ref_rejected_logps": -2.0},
            {"prompt_ids": [6], "chosen_ids": [7, 8], "rejected_ids": [9], "ref_chosen_logps": -3.0,
             "ref_rejected_logps": -4.0},
        ]
    )  # fmt: skip
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 0, 0, 0],
        [6, 7, 8, 0, 0, 0],
        [1, 2, 4, 5, 0, 0],
        [6, 9, 0, 0, 0, 0],
    ]
    assert batch["attention_mask"].tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0],
    ]
    assert batch["completion_mask"].tolist() == [
        [0, 0, 1, 0, 0, 0],
        [0, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 1, 0, 0, 0, 0],
    ]
    torch.testing.assert_close(batch["ref_chosen_logps"], torch.tensor([-1.0, -3.0]))
    torch.testing.assert_close(batch["ref_rejected_logps"], torch.tensor([-2.0, -4.0]))
    plain = DataCollatorForPreference(0)([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]}])
    assert set(plain) == {"input_ids", "attention_mask", "completion_mask"}
