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
