"""`update_with_replay_buffer` (GRPOWithReplayBuffer's method) is the training path: an override changes what
train() trains on; buffered groups longer than the batch widen it."""

import torch

from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer, ReplayBuffer
from tests.conftest import tiny_args
from tests.replay.test_trainer import RecordingTrainer, make, task_reward


class ZeroAdvantages(GRPOWithReplayBufferTrainer):
    """An override with TRL's signature: every batch goes through it, with all advantages zeroed."""

    calls: list

    def update_with_replay_buffer(
        self,
        group_advantages,
        group_std_rewards,
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        forward_kwargs,
        num_items_in_batch,
        old_per_token_logps=None,
        ref_per_token_logps=None,
        importance_sampling_ratio=None,
    ):
        self.calls.append((tuple(group_advantages.shape), tuple(group_std_rewards.shape), num_items_in_batch))
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": torch.zeros_like(group_advantages),
            "num_items_in_batch": num_items_in_batch,
        }


def test_an_override_of_update_with_replay_buffer_decides_what_is_trained(model, tokenizer, dataset, tmp_path):
    args = tiny_args(GRPOWithReplayBufferConfig, tmp_path, beta=0.0, replay_buffer_size=4, max_steps=2)
    ZeroAdvantages.calls = []
    trainer = ZeroAdvantages(
        model=model, reward_funcs=task_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    # called once per generation batch with (num_groups, G) tensors and the batch's completion-token count
    assert len(ZeroAdvantages.calls) == 2
    assert all(adv == (1, 4) and std == (1, 4) and n > 0 for adv, std, n in ZeroAdvantages.calls)
    # zero advantages, beta 0: zero gradient, so Adam leaves every weight where it was
    for n, p in trainer.model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_a_buffered_group_longer_than_the_batch_widens_it(model, tokenizer, dataset, tmp_path):
    trainer = make(model, tokenizer, dataset, tmp_path, cls=RecordingTrainer)
    trainer.replay_buffer = ReplayBuffer(max_size=4)
    trainer.num_generations = 2
    pad = tokenizer.pad_token_id
    trainer.replay_buffer.add(
        [1.0],
        [
            {
                "prompt_ids": torch.tensor([[40, 41, 42, 43], [pad, 44, 45, 46]]),
                "prompt_mask": torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]),
                "completion_ids": torch.tensor([[50, 51, 52, 53], [54, pad, pad, pad]]),
                "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]]),
                "advantages": [0.7, -0.7],
                "old_per_token_logps": torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-5.0, 0.0, 0.0, 0.0]]),
            }
        ],
    )
    advantages = torch.tensor([[0.0, 0.0], [0.5, -0.5]])  # group 0 zero-std, group 1 not
    std = torch.tensor([0.0, 0.7]).unsqueeze(1).expand(-1, 2)
    out = trainer.update_with_replay_buffer(
        advantages,
        std,
        torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]]),
        torch.ones(4, 2, dtype=torch.long),
        torch.tensor([[9, 10], [11, pad], [13, 14], [15, 16]]),
        torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]]),
        {},
        7,
        old_per_token_logps=torch.tensor([[-0.1, -0.2], [-0.3, 0.0], [-0.5, -0.6], [-0.7, -0.8]]),
    )
    assert out["prompt_ids"].tolist() == [[40, 41, 42, 43], [pad, 44, 45, 46], [pad, pad, 5, 6], [pad, pad, 7, 8]]
    assert out["prompt_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]
    completions = [[50, 51, 52, 53], [54, pad, pad, pad], [13, 14, pad, pad], [15, 16, pad, pad]]
    assert out["completion_ids"].tolist() == completions
    assert out["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert torch.allclose(out["advantages"], torch.tensor([[0.7, -0.7], [0.5, -0.5]]))
    old = out["old_per_token_logps"]
    assert old[0].tolist() == [-1.0, -2.0, -3.0, -4.0] and torch.allclose(old[3, :2], torch.tensor([-0.7, -0.8]))
    assert old[3, 2:].isnan().all()  # padding: unknown, masked out
    assert out["num_items_in_batch"] == 7
    # the group with variance entered the (TRL-style) buffer trimmed, scored sum|A| * std = 1.0 * 0.7
    score, item = max(trainer.replay_buffer.heap, key=lambda e: e[1]["prompt_ids"][0, 0] == 5)
    assert item["prompt_ids"].tolist() == [[5, 6], [7, 8]] and abs(score - 0.7) < 1e-6


def _group(prompt: list[int], completion: list[int], advantages: list[float], **extra) -> dict:
    """One stored group of two rows in TRL's format: prompts (2, P), completions (2, C), its advantages."""
    return {
        "prompt_ids": torch.tensor([prompt, [p + 1 for p in prompt]]),
        "prompt_mask": torch.ones(2, len(prompt), dtype=torch.long),
        "completion_ids": torch.tensor([completion, [c + 1 for c in completion]]),
        "completion_mask": torch.ones(2, len(completion), dtype=torch.long),
        "advantages": torch.tensor([advantages]),
        **extra,
    }


def _batch_of_two_groups(advantages: list[list[float]], **extra) -> tuple:
    """update_with_replay_buffer's positional arguments for a batch of two groups of two rows, width 2."""
    adv = torch.tensor(advantages)
    std = adv.std(dim=1, keepdim=True).expand_as(adv)
    ids = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]])
    completion = torch.tensor([[9, 10], [11, 12], [13, 14], [15, 16]])
    ones = torch.ones(4, 2, dtype=torch.long)
    return adv, std, ids, ones, completion, ones.clone(), extra, 4


def _buffered_trainer(model, tokenizer, dataset, tmp_path, groups: list[dict]):
    trainer = make(model, tokenizer, dataset, tmp_path, cls=RecordingTrainer)
    trainer.replay_buffer = ReplayBuffer(max_size=5)
    trainer.num_generations = 2
    trainer.replay_buffer.add([0.1 * (i + 1) for i in range(len(groups))], groups)
    return trainer


def test_only_zero_std_groups_swaps_every_group_and_carries_their_fields(model, tokenizer, dataset, tmp_path):
    extra = {"pixel_values": torch.randn(2, 3, 4, 4), "old_per_token_logps": torch.randn(2, 2)}
    groups = [_group([100, 101], [5, 6], [0.5, 0.6], **extra), _group([104, 105], [13, 14], [0.8, 0.85], **extra)]
    trainer = _buffered_trainer(model, tokenizer, dataset, tmp_path, groups)
    args = _batch_of_two_groups([[0.5, 0.5], [0.8, 0.8]], pixel_values=torch.randn(4, 3, 4, 4))
    out = trainer.update_with_replay_buffer(*args, old_per_token_logps=torch.randn(4, 2))
    assert "pixel_values" in out and "old_per_token_logps" in out  # the buffered groups' own fields come along
    assert len(trainer.replay_buffer.heap) == 2  # nothing with variance to store
    batch_prompts = args[2].tolist()
    assert all(row not in batch_prompts for row in out["prompt_ids"].tolist())  # both groups came from the buffer


def test_groups_with_variance_are_stored_and_nothing_is_swapped(model, tokenizer, dataset, tmp_path):
    groups = [_group([100, 101], [5, 6], [0.5, 0.6]), _group([104, 105], [13, 14], [0.8, 0.85])]
    trainer = _buffered_trainer(model, tokenizer, dataset, tmp_path, groups)
    assert trainer.update_with_replay_buffer(*_batch_of_two_groups([[0.6, 0.4], [0.7, 1.2]])) is None
    assert len(trainer.replay_buffer.heap) == 4  # both groups of the batch entered the buffer


def test_a_buffered_group_shorter_than_the_batch_is_padded_to_its_width(model, tokenizer, dataset, tmp_path):
    groups = [_group([100, 101], [5, 6], [0.5, 0.6]), _group([104, 105], [13, 14], [0.8, 0.85])]
    trainer = _buffered_trainer(model, tokenizer, dataset, tmp_path, groups)
    pad = tokenizer.pad_token_id
    adv = torch.tensor([[0.6, 0.6], [0.3, 0.45]])  # group 0 zero-std (swapped), group 1 has variance (stored)
    prompts = torch.tensor([[1, 2, pad], [1, 2, pad], [3, 4, 5], [3, 4, 5]])
    prompt_mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    completions = torch.tensor([[1009, 1010, pad], [1011, 1012, 1013], [1013, 1014, pad], [1015, 1016, 1017]])
    completion_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    std = adv.std(dim=1, keepdim=True).expand_as(adv)
    out = trainer.update_with_replay_buffer(adv, std, prompts, prompt_mask, completions, completion_mask, {}, 4)
    assert out["prompt_ids"].shape[-1] == 3  # the batch's width is kept
    swapped = out["prompt_ids"][:2].tolist()
    assert swapped in ([[pad, 100, 101], [pad, 101, 102]], [[pad, 104, 105], [pad, 105, 106]])  # left-padded
    assert out["completion_ids"][:2, 2].tolist() == [pad, pad]  # completions right-padded
    assert out["prompt_ids"][2:].tolist() == [[3, 4, 5], [3, 4, 5]]  # the group with variance stays
    stored = [item["prompt_ids"].tolist() for _, item in trainer.replay_buffer.heap]
    assert len(stored) == 3 and [[3, 4, 5], [3, 4, 5]] in stored  # and entered the buffer, untrimmed here
