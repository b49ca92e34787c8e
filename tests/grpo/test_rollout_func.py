"""`rollout_func` (TRL's experimental custom rollout) through `train()`: its rows are what is trained on, its extra
fields reach the reward functions, its `env_mask` tokens get no loss weight and no gradient, its log-probs are
kept as the rows' engine (behaviour-sampler) log-probs, also through the replay buffer; TRL's errors and warning."""

import copy
import warnings

import pytest
import torch

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from tests.conftest import tiny_args


class ExternalRollout:
    """An external sampler: row i's completion is the model's part `m{i}`, then `tail` inserted by the environment
    (env_mask 0); its log-probs are made up (-0.1 * (position + 1)); `score` (per row) and `source` (one value for
    all) are extra fields. `scores(call)` gives the scores of the call-th batch."""

    def __init__(self, tokenizer, tail="|obs|", scores=lambda call, n: [float(i % 4) for i in range(n)], mask=True):
        self.tok, self.tail, self.scores, self.mask = tokenizer, tail, scores, mask
        self.calls, self.outputs, self.prompts = 0, [], []

    def __call__(self, prompts, trainer):
        self.prompts.append(prompts)
        encode = lambda text: self.tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        model_parts = [encode(f"m{i}") for i in range(len(prompts))]
        tail = encode(self.tail)
        completions = [part + tail for part in model_parts]
        out = {
            "prompt_ids": [encode(p if isinstance(p, str) else p[-1]["content"]) for p in prompts],
            "completion_ids": completions,
            "logprobs": [[-0.1 * (j + 1) for j in range(len(c))] for c in completions],
            "env_mask": [[1] * len(m) + [0 if self.mask else 1] * len(tail) for m in model_parts],
            "score": self.scores(self.calls, len(prompts)),
            "source": "external",
        }
        self.calls += 1
        self.outputs.append(out)
        return out


def assert_rows_close(values, mask, rows):
    """`values` (N, C) at the real positions `mask` equal the ragged `rows`."""
    torch.testing.assert_close(values[mask], torch.tensor([v for row in rows for v in row], dtype=values.dtype))


def score_reward(completions, score, **kwargs):
    return score


def train(model, tokenizer, dataset, tmp_path, rollout, cls=GRPOTrainer, config=GRPOConfig, **overrides):
    args = tiny_args(config, tmp_path, **{"max_steps": 1, "shuffle_dataset": False, **overrides})
    trainer = cls(
        model=model, reward_funcs=score_reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        rollout_func=rollout,
    )  # fmt: skip
    trainer.train()
    return trainer


@pytest.mark.parametrize("conversational", [False, True])
def test_rollout_rows_are_trained_and_extra_fields_reach_rewards(
    model, tokenizer, dataset, chat_dataset, tmp_path, conversational
):
    seen = {}

    def spy(prompts, completions, completion_ids, score, source, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, score=score, source=source)
        return score

    rollout = ExternalRollout(tokenizer)
    data = chat_dataset if conversational else dataset
    args = tiny_args(GRPOConfig, tmp_path, max_steps=1, shuffle_dataset=False)
    trainer = GRPOTrainer(
        model=model, reward_funcs=spy, args=args, train_dataset=data, processing_class=tokenizer, rollout_func=rollout
    )
    trainer.train()

    assert rollout.prompts[0] == [data[0]["prompt"]] * 4  # raw prompts (messages untemplated), each repeated G times
    out = rollout.outputs[0]
    assert seen["completion_ids"] == out["completion_ids"]
    texts = tokenizer.batch_decode(out["completion_ids"], skip_special_tokens=True)
    assert seen["completions"] == ([[{"role": "assistant", "content": t}] for t in texts] if conversational else texts)
    assert seen["score"] == [0.0, 1.0, 2.0, 3.0] and seen["source"] == ["external"] * 4
    batch = trainer._micro_batches[0]
    real = batch.completion_mask.bool()
    assert [row[m].tolist() for row, m in zip(batch.completion_ids, real)] == out["completion_ids"]
    assert [row[m].tolist() for row, m in zip(batch.prompt_ids, batch.prompt_mask.bool())] == out["prompt_ids"]
    torch.testing.assert_close(batch.rewards, torch.tensor([0.0, 1.0, 2.0, 3.0]))
    # the rollout's log-probs are kept as the rows' sampler (engine) log-probs
    assert_rows_close(batch.engine_logps, real, out["logprobs"])


def test_env_mask_tokens_get_no_loss_weight_and_no_gradient(model, tokenizer, dataset, tmp_path):
    """The environment's tokens close each completion, so they are context for no trained token: what they are
    cannot change the update when they are masked, and does when they are not."""
    runs = {}
    for name, tail, mask in [("x", "|obs|", True), ("y", "#abc#", True), ("unmasked", "|obs|", False)]:
        rollout = ExternalRollout(tokenizer, tail=tail, mask=mask)
        trainer = train(copy.deepcopy(model), tokenizer, dataset, tmp_path / name, rollout, optim="sgd")
        runs[name] = (trainer, [p.detach().clone() for p in trainer.model.parameters()])
    batch = runs["x"][0]._micro_batches[0]
    env = batch.completion_mask.bool() & (batch.tool_mask == 0)
    assert env.sum(1).tolist() == [5] * 4  # the tail, for every row
    assert batch.loss_weights[env].eq(0).all() and batch.loss_weights[batch.completion_mask.bool() & ~env].gt(0).all()
    for a, b in zip(runs["x"][1], runs["y"][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert any(not torch.allclose(a, b) for a, b in zip(runs["x"][1], runs["unmasked"][1]))
    assert any(not torch.equal(a, b) for a, b in zip(runs["x"][1], model.parameters()))


class RecordingReplay(GRPOWithReplayBufferTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.seen = [*getattr(self, "seen", []), inputs.rows(slice(None))]
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.mark.parametrize("unit", ["rollout", "group"])
def test_replay_buffer_keeps_the_rollout_log_probs_and_env_mask(model, tokenizer, dataset, tmp_path, unit):
    """Batch 1 has reward variance (stored); batch 2 is all-zero and buffered data is appended to it: with
    replay_unit="group" the stored group (G=4, rewards 0-3), by default the G stored rollouts that beat their group
    (G=2, rewards 0 1 0 1: rows 1 and 3). The replayed rows carry batch 1's rollout log-probs and env_mask, and the
    environment's tokens stay out of the loss."""
    G, picked = (4, [0, 1, 2, 3]) if unit == "group" else (2, [1, 3])
    rollout = ExternalRollout(tokenizer, scores=lambda call, n: [float(i % G) * (call == 0) for i in range(n)])
    trainer = train(
        model, tokenizer, dataset, tmp_path, rollout, cls=RecordingReplay, config=GRPOWithReplayBufferConfig,
        max_steps=2, replay_buffer_size=4, replay_unit=unit, num_generations=G,
    )  # fmt: skip
    first = rollout.outputs[0]
    stored = trainer.replay_buffer.groups[0].rollout  # batch 1's first group
    real = stored.completion_mask.bool()
    assert_rows_close(stored.engine_logps, real, first["logprobs"][:G])
    assert [row[m].tolist() for row, m in zip(stored.tool_mask, real)] == first["env_mask"][:G]
    batch = trainer.seen[1]  # the appended rows follow the fresh (zero-std) groups
    rows = batch.replayed
    assert rows.tolist() == [False] * 4 + [True] * len(picked) and batch.policy_version[rows].eq(0).all()
    ids, mask = batch.completion_ids[rows], batch.completion_mask[rows].bool()
    source = {tuple(c): i for i, c in enumerate(first["completion_ids"])}
    order = [source[tuple(row[m].tolist())] for row, m in zip(ids, mask)]  # rollouts come in draw order
    assert sorted(order) == picked
    env = mask & (batch.tool_mask[rows] == 0)
    assert env.sum() == 5 * len(picked) and batch.loss_weights[rows][env].eq(0).all()
    assert [row[m].tolist() for row, m in zip(batch.tool_mask[rows], mask)] == [first["env_mask"][i] for i in order]
    assert_rows_close(batch.engine_logps[rows], mask, [first["logprobs"][i] for i in order])


def test_rollout_func_errors(model, tokenizer, dataset, tmp_path):
    def broken(change):
        def rollout(prompts, trainer):
            out = ExternalRollout(tokenizer)(prompts, trainer)
            change(out)
            return out

        return rollout

    cases = [
        (lambda o: o.pop("logprobs"), r"rollout_func must return keys \['logprobs'\] in its output dict\."),
        (lambda o: (o.pop("prompt_ids"), o.pop("completion_ids")), r"keys \['completion_ids', 'prompt_ids'\]"),
        (lambda o: o["completion_ids"].pop(), "returned 3 completion_ids for 4 prompts"),
        (lambda o: o["logprobs"][1].pop(), "row 1: 6 logprobs for 7 completion_ids"),
        (lambda o: o["env_mask"][2].append(1), "row 2: env_mask has 8 entries for 7 completion_ids"),
    ]
    for i, (change, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            train(copy.deepcopy(model), tokenizer, dataset, tmp_path / str(i), broken(change))


def test_experimental_warning_and_its_silencing(model, tokenizer, dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    args = tiny_args(GRPOConfig, tmp_path)
    kwargs = dict(model=model, reward_funcs=score_reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    with pytest.warns(UserWarning, match="You are using 'rollout_func', which is an experimental feature"):
        GRPOTrainer(**kwargs, rollout_func=ExternalRollout(tokenizer))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOTrainer(**kwargs, rollout_func=ExternalRollout(tokenizer))
