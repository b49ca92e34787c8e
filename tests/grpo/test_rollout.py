import math

import torch

from replayrl.grpo.rollout import Rollout


def rollout(prompt_lens, completion_lens, P=5, C=4, logps=True):
    n = len(prompt_lens)
    pm = torch.zeros(n, P, dtype=torch.long)
    cm = torch.zeros(n, C, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        pm[i, P - p :] = 1
        cm[i, :c] = 1
    return Rollout(
        prompt_ids=torch.arange(n * P).reshape(n, P) * pm,
        prompt_mask=pm,
        completion_ids=(torch.arange(n * C).reshape(n, C) + 100) * cm,
        completion_mask=cm,
        rewards=torch.arange(n, dtype=torch.float),
        advantages=torch.zeros(n),
        policy_version=torch.zeros(n, dtype=torch.long),
        replayed=torch.zeros(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        old_logps=-torch.rand(n, C) * cm if logps else None,
    )


def test_trim_cuts_left_padding_of_prompts_and_right_padding_of_completions():
    r = rollout([2, 3], [1, 2])
    t = r.trim()
    assert t.prompt_ids.shape == (2, 3) and t.completion_ids.shape == (2, 2)
    assert torch.equal(t.prompt_ids, r.prompt_ids[:, 2:])  # the real (right-aligned) prompt tokens survive
    assert torch.equal(t.completion_ids, r.completion_ids[:, :2])
    assert torch.equal(t.old_logps, r.old_logps[:, :2])


def test_concat_repads_each_side_and_fills_missing_logps_with_nan():
    a = rollout([2, 2], [1, 1]).trim()  # P=2, C=1
    b = rollout([4, 3], [3, 2], logps=False).trim()  # P=4, C=3
    c = Rollout.concat([a, b], pad_token_id=7)
    assert c.prompt_ids.shape == (4, 4) and c.completion_ids.shape == (4, 3)
    assert torch.equal(c.prompt_mask[0], torch.tensor([0, 0, 1, 1]))  # left-padded
    assert torch.equal(c.prompt_ids[0, :2], torch.tensor([7, 7]))
    assert torch.equal(c.completion_mask[0], torch.tensor([1, 0, 0]))  # right-padded
    assert c.old_logps[2:].isnan().all() and not c.old_logps[:2, :1].isnan().any()
    assert math.isnan(c.old_logps[0, 1])  # padding of log-probs is NaN too (masked out anyway)


def test_split_and_rows_round_trip():
    r = rollout([1, 2, 3, 4], [4, 3, 2, 1])
    parts = r.split(2)
    assert [p.num_rows for p in parts] == [2, 2]
    back = Rollout.concat(parts)
    for name, value in r.state_dict().items():
        assert (value is None and getattr(back, name) is None) or torch.equal(value, getattr(back, name)), name


def test_state_dict_round_trip():
    r = rollout([1, 2], [2, 2])
    again = Rollout.from_state_dict(r.state_dict())
    assert torch.equal(again.old_logps, r.old_logps) and again.ref_logps is None
