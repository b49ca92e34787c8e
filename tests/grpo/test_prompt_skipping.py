"""GRESO-style prompt skipping (arXiv:2506.02177): the skip rule and the selection by hand, then through `train()`
(which prompts were generated, the batch stays full, exact resume with the history in the checkpoint)."""

import pytest
import torch
from datasets import Dataset

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.grpo.prompt_skipping import PromptHistory, prompt_key, select_prompts
from replayrl.models.tiny import build_tiny_model
from tests.conftest import tiny_args


def row(name: str) -> dict:
    return {"prompt": name}


def history(streaks: dict[str, int], explore: float = 0.5, target=None) -> PromptHistory:
    h = PromptHistory(explore, target)
    for name, z in streaks.items():
        for i in range(z + 1):  # one group with variance, then z zero-std ones
            h.record(prompt_key(row(name)), i > 0, float(i))
    return h


def test_skip_probability_and_the_controller_by_hand():
    h = history({"a": 1, "b": 3, "c": 10, "d": 0})
    assert h.skip_probability(prompt_key(row("a"))) == pytest.approx(0.5)  # 1 - 0.5
    assert h.skip_probability(prompt_key(row("b"))) == pytest.approx(0.875)  # 1 - 0.5**3
    assert h.skip_probability(prompt_key(row("c"))) == pytest.approx(0.99)  # 1 - max(0.5**10, 0.01)
    assert h.skip_probability(prompt_key(row("d"))) == 0.0  # its last group had variance
    assert h.skip_probability(prompt_key(row("never seen"))) == 0.0
    assert h.last_mean[prompt_key(row("b"))] == 3.0
    h.record(prompt_key(row("b")), False, 0.5)  # a group with variance ends the streak
    assert h.skip_probability(prompt_key(row("b"))) == 0.0
    h = PromptHistory(0.5, 0.25)
    h.adapt(0.25)  # at the target: skip more
    assert h.explore == pytest.approx(0.49)
    h.adapt(0.1)
    h.adapt(0.1)
    assert h.explore == pytest.approx(0.51)
    h.explore = 0.055
    h.adapt(1.0)
    assert h.explore == pytest.approx(0.05)  # GRESO's bounds [0.05, 0.95]
    fixed = PromptHistory(0.3, None)
    fixed.adapt(1.0)
    assert fixed.explore == 0.3


def seed_where(condition) -> torch.Generator:
    """A generator whose first uniform draws satisfy `condition` (the draws `select_prompts` makes, in order)."""
    for seed in range(1000):
        draws = torch.Generator().manual_seed(seed)
        if condition([float(torch.rand((), generator=draws)) for _ in range(8)]):
            return torch.Generator().manual_seed(seed)
    raise AssertionError("no seed found")


def test_skipped_prompts_are_replaced_from_the_pool_and_the_batch_stays_full():
    h = history({"a": 5, "b": 5})  # skip probability 1 - 0.5**5 = 0.96875 each; c, d, e, f never seen
    generator = seed_where(lambda u: u[0] < 0.96875 and u[1] < 0.96875)
    drawn = [row("a"), row("b"), row("c"), row("d")]
    pool = [row("a"), row("e"), row("c"), row("f"), row("g")]  # a and c were tested already: passed over
    selection = select_prompts(drawn, h, pool, generator)
    assert [r["prompt"] for r in selection.rows] == ["c", "d", "e", "f"]
    assert selection.generated_drawn == [False, False, True, True]
    assert (selection.replacements, selection.filled) == (2, 0)


def test_when_the_candidates_run_out_the_lowest_skip_probabilities_are_generated():
    h = history({"a": 5, "b": 1, "x": 2})  # skip probabilities 0.96875, 0.5, 0.75
    generator = seed_where(lambda u: u[0] < 0.96875 and u[1] < 0.5 and u[2] < 0.75)  # all three tests fire
    selection = select_prompts([row("a"), row("b")], h, [row("a"), row("x")], generator)
    assert [r["prompt"] for r in selection.rows] == ["b", "x"]
    assert selection.generated_drawn == [False, True]
    assert (selection.replacements, selection.filled) == (1, 2)


def test_config_validation():
    with pytest.raises(ValueError, match="prompt_skipping_explore"):
        GRPOConfig(output_dir="x", prompt_skipping=True, prompt_skipping_explore=0.0)
    with pytest.raises(ValueError, match="prompt_skipping_target_zero_std"):
        GRPOConfig(output_dir="x", prompt_skipping=True, prompt_skipping_target_zero_std=1.5)
    with pytest.raises(ValueError, match="prompt_skipping=True with async_generation=True"):
        GRPOConfig(output_dir="x", prompt_skipping=True, async_generation=True)


# ------------------------------------------------------------------------------------------------ through train()
FLAT = [f"a{i}" for i in range(4)]  # always reward 0: every group zero-std
VARIED = [f"b{i}" for i in range(4)]
DATA = Dataset.from_dict({"prompt": FLAT + VARIED})


class Recorder:
    """A reward function that records the prompts of every call (one call per generation batch)."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.__name__ = "recorder"

    def __call__(self, completions, prompts, **kwargs):
        self.calls.append(list(prompts))
        return [0.0 if p.startswith("a") else float(sum(map(ord, c)) % 5) + 0.1 * i for i, (c, p) in
                enumerate(zip(completions, prompts))]  # fmt: skip


def train(tokenizer, tmp_path, cls=GRPOTrainer, config=GRPOConfig, resume=None, **overrides):
    """A fresh tiny model trained on DATA (G=4, 2 prompts per step); (trainer, the prompts of every reward call)."""
    settings = dict(per_device_train_batch_size=8, max_steps=12, beta=0.0, max_completion_length=2)
    args = tiny_args(config, tmp_path, **{**settings, **overrides})
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    reward = Recorder()
    trainer = cls(model=model, reward_funcs=reward, args=args, train_dataset=DATA, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, reward.calls


def flat_groups(calls: list[list[str]], G: int = 4) -> int:
    return sum(p.startswith("a") for call in calls for p in call[::G])


def test_prompts_with_zero_std_streaks_are_skipped_and_replaced(tokenizer, tmp_path):
    """Prompts 'a*' always score 0. Without skipping half the groups generated are theirs; with skipping (p fixed
    at its floor: a prompt with a streak is generated with probability 0.01) they stop being generated once seen,
    and prompts 'b*' (groups with variance) take their place; every batch stays full and is what was scored."""
    _, plain = train(tokenizer, tmp_path / "plain")
    assert flat_groups(plain[4:]) == 8  # 8 of the 16 groups of steps 5-12
    trainer, calls = train(
        tokenizer, tmp_path / "skip", prompt_skipping=True, prompt_skipping_explore=1e-9,
        prompt_skipping_target_zero_std=None,
    )  # fmt: skip
    assert [len(c) for c in calls] == [8] * 12  # the batch stays full: 2 groups of G=4 per generation
    assert all(len(set(c[i : i + 4])) == 1 for c in calls for i in (0, 4))  # whole groups of one prompt
    assert flat_groups(calls[4:]) <= 1  # against 8 without skipping
    logs = [h for h in trainer.state.log_history if "prompt_skipping/skipped" in h]
    assert len(logs) == 12 and sum(h["prompt_skipping/skipped"] for h in logs) >= 6
    for h in logs:  # every skipped prompt was replaced (enough 'b' candidates: nothing filled)
        assert h["prompt_skipping/replacements"] == h["prompt_skipping/skipped"]
        assert h["prompt_skipping/filled"] == 0
    streaks = trainer.prompt_history.streak
    assert all(streaks[prompt_key(row(p))] >= 1 for p in FLAT)


def test_resume_is_exact_with_the_history_in_the_checkpoint(tokenizer, tmp_path):
    """The replay default (append) with skipping, resumed from its step-4 checkpoint: the same prompts generated,
    the same losses and the same history as the uninterrupted run."""
    settings = dict(cls=GRPOWithReplayBufferTrainer, config=GRPOWithReplayBufferConfig, max_steps=8)
    settings.update(prompt_skipping=True, replay_buffer_size=4, save_strategy="steps", save_steps=4)
    full, full_calls = train(tokenizer, tmp_path / "full", **settings)
    checkpoint = tmp_path / "full" / "out" / "checkpoint-4"
    resumed, resumed_calls = train(tokenizer, tmp_path / "resumed", resume=str(checkpoint), **settings)
    assert resumed_calls == full_calls[4:]
    assert sum(h["prompt_skipping/skipped"] for h in full.state.log_history if "prompt_skipping/skipped" in h) > 0

    def logged(trainer):
        keys = ("loss", "prompt_skipping/explore", "prompt_skipping/drawn_reward", "replay/groups_replaced")
        return [h[k] for h in trainer.state.log_history if "loss" in h and h["step"] > 4 for k in keys]

    assert len(logged(resumed)) == 16 and logged(resumed) == pytest.approx(logged(full), abs=1e-6)
    assert resumed.prompt_history.state_dict() == full.prompt_history.state_dict()


def test_a_streaming_dataset_is_refused(model, tokenizer, tmp_path):
    args = tiny_args(GRPOConfig, tmp_path, prompt_skipping=True, beta=0.0)
    with pytest.raises(ValueError, match="prompt_skipping draws replacement prompts by index"):
        GRPOTrainer(
            model=model, reward_funcs=Recorder(), args=args, train_dataset=DATA.to_iterable_dataset(),
            processing_class=tokenizer,
        )  # fmt: skip
