"""Environments (TRL's `environment_factory`) through `train()`: reset and its observation in the prompt, the
environment's methods as tools called on the rollout's own instance, environment-owned rewards (`reward_funcs`
omitted) and data (`train_dataset` omitted), several environments routed by the `environment` column, TRL's errors
and its experimental warning. The tiny model never calls a tool by itself: its first turns are scripted."""

import warnings

import pytest
import torch
from datasets import Dataset

from replayrl import GRPOConfig, GRPOTrainer
from replayrl.models.tiny import build_tiny_model
from replayrl.tasks.calculator import build_tool_tokenizer
from replayrl.tasks.counter import CounterEnv, counter_dataset
from tests.conftest import tiny_args


class EchoEnv:
    """A second environment, without a reward of its own."""

    def reset(self, **example):
        self.example = example
        return " Echo it."

    def echo(self, text: str) -> str:
        """Echo a text.

        Args:
            text: The text to echo.
        """
        return text


class ScriptedCalls(GRPOTrainer):
    """Row i's first turn becomes a call of its environment's tool: counter rows `increment(step)` with the step
    `steps(i, env)`; echo rows `echo("hi")`. The tool loop then runs as usual (results fed back, masked)."""

    steps = staticmethod(lambda i, env: env.target if i % 2 == 0 else 1)

    def _call_tools(self, prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, mode):
        calls = [self._scripted_call(i, env) for i, env in enumerate(self.environments)]
        ids = [self.processing_class(c + "<|im_end|>", add_special_tokens=False)["input_ids"] for c in calls]
        width = max(len(row) for row in ids)
        out = torch.full((len(ids), width), self.generation_config.pad_token_id)
        mask = torch.zeros_like(out)
        for i, row in enumerate(ids):
            out[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        return super()._call_tools(prompt_ids, prompt_mask, out, mask, torch.zeros_like(truncated), mode)

    def _scripted_call(self, i, env):
        if isinstance(env, EchoEnv):
            return '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
        return f'<tool_call>{{"name": "increment", "arguments": {{"step": {self.steps(i, env)}}}}}</tool_call>'


@pytest.fixture
def tool_tok():
    return build_tool_tokenizer()


@pytest.fixture
def tool_model(tool_tok):
    return build_tiny_model(tool_tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)


def env_args(tmp_path, **overrides):
    settings = dict(max_steps=1, max_completion_length=90, max_prompt_length=None, max_tool_calling_iterations=1)
    return tiny_args(GRPOConfig, tmp_path, **{**settings, **overrides})


def test_environment_tools_reset_and_owned_reward(tool_model, tool_tok, tmp_path):
    seen = {}

    def spy(prompts, completions, environments, target, **kwargs):
        seen.update(prompts=prompts, completions=completions, environments=list(environments), target=target)
        return [0.0] * len(prompts)

    trainer = ScriptedCalls(
        model=tool_model, reward_funcs=spy, args=env_args(tmp_path), train_dataset=counter_dataset(4),
        processing_class=tool_tok, environment_factory=CounterEnv,
    )  # fmt: skip
    assert trainer.reward_func_names == ["spy", "CounterEnv"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]
    assert [t.__name__ for t in trainer.tools] == ["increment"]
    trainer.train()

    envs = seen["environments"]
    assert len({id(e) for e in envs}) == 4  # one instance per rollout
    target = seen["target"][0]
    assert [e.target for e in envs] == [target] * 4  # reset with the example's `target` column
    assert seen["prompts"][0][-1]["content"] == f"Count. Reach {target} with the increment tool."
    assert [e.count for e in envs] == [target, 1, target, 1]  # each call ran on the rollout's own instance
    assert [e.calls for e in envs] == [1, 1, 1, 1]
    tool_turn = seen["completions"][0][1]
    assert tool_turn == {"role": "tool", "name": "increment", "content": str(target)}
    # the environment's reward: 1 at the target, linear below; logged under the class name
    expected = [1.0, 1 - abs(target - 1) / target] * 2
    log = trainer.state.log_history[0]
    assert log["rewards/CounterEnv/mean"] == pytest.approx(sum(expected) / 4)
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0  # TRL's rates
    batch = trainer._micro_batches[0]
    torch.testing.assert_close(batch.rewards, torch.tensor(expected))
    text = tool_tok.decode(batch.prompt_ids[0][batch.prompt_mask[0].bool()])
    assert "Tools: increment" in text and f"Reach {target} with" in text
    results = batch.completion_mask.bool() & (batch.tool_mask == 0)  # the tool's answers: no loss weight
    assert results.sum(1).gt(0).all() and batch.loss_weights[results].eq(0).all()

    # pooled: a second batch resets the same instances ("construct once, reset often")
    trainer._generate_and_score([{"prompt": [{"role": "user", "content": "Count."}], "target": 3}] * 4, "eval")
    assert [id(e) for e in trainer.environments] == [id(e) for e in envs]
    assert [e.target for e in envs] == [3] * 4


def test_environment_owns_the_data_and_the_reward(tool_model, tool_tok, tmp_path):
    """No reward_funcs, no train_dataset: reset() supplies the prompt, get_reward() the reward."""
    trainer = ScriptedCalls(
        model=tool_model, args=env_args(tmp_path, max_steps=2), processing_class=tool_tok,
        environment_factory=CounterEnv,
    )  # fmt: skip
    assert trainer.reward_func_names == ["CounterEnv"] and len(trainer.train_dataset) == 1
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
    targets = [e.target for e in trainer.environments]
    assert len(set(targets)) == 1  # one seeded draw per batch, shared by its rollouts
    batch = trainer._micro_batches[0]
    text = tool_tok.decode(batch.prompt_ids[0][batch.prompt_mask[0].bool()])
    user = f"<|im_start|>user\n Reach {targets[0]} with the increment tool.<|im_end|>\n"
    assert text.endswith(user + "<|im_start|>assistant\n")
    assert [h["rewards/CounterEnv/mean"] for h in trainer.state.log_history if "loss" in h][1] > 0


def test_several_environments_routed_by_the_dataset_column(tool_model, tool_tok, tmp_path):
    seen = {}

    def spy(completions, environments, environment, **kwargs):
        seen.update(environments=list(environments), environment=environment)
        return [float(i) for i in range(len(completions))]

    data = Dataset.from_dict(
        {"environment": ["counter", "echo"], "target": [5, 7], "prompt": [[{"role": "user", "content": "Go."}]] * 2}
    )
    trainer = ScriptedCalls(
        model=tool_model, reward_funcs=spy, args=env_args(tmp_path, shuffle_dataset=False, num_generations=2),
        train_dataset=data, processing_class=tool_tok, environment_factory={"counter": CounterEnv, "echo": EchoEnv},
    )  # fmt: skip
    assert [t.__name__ for t in trainer.tools] == ["increment", "echo"]
    env_tools = {k: [t.__name__ for t in v] for k, v in trainer._env_tools.items()}
    assert env_tools == {"counter": ["increment"], "echo": ["echo"]}
    assert [len(pool) for pool in trainer._environment_pool.values()] == [1, 1]  # the probes seed the pools
    assert list(trainer.environment_factories) == ["counter", "echo"]
    assert trainer.reward_func_names == ["spy", "CounterEnv"]  # only the counter owns a reward
    trainer.train()
    envs = seen["environments"]
    assert seen["environment"] == ["counter", "counter", "echo", "echo"]
    assert [type(e) for e in envs] == [CounterEnv, CounterEnv, EchoEnv, EchoEnv]
    assert [e.count for e in envs[:2]] == [5, 1] and envs[0].target == 5
    assert envs[2].example == {"prompt": [{"role": "user", "content": "Go."}], "target": 7}  # no `environment`
    batch = trainer._micro_batches[0]
    texts = [tool_tok.decode(ids[m.bool()]) for ids, m in zip(batch.prompt_ids, batch.prompt_mask)]
    assert "Tools: increment<" in texts[0] and "Go. Reach 5 with" in texts[0]  # each prompt: its own tools only
    assert "Tools: echo<" in texts[2] and "Go. Echo it." in texts[2]
    completions = [tool_tok.decode(ids[m.bool()]) for ids, m in zip(batch.completion_ids, batch.completion_mask)]
    assert "tool\nhi<|im_end|>" in completions[2]  # echo ran on the echo rows' instances
    # CounterEnv's reward is None (not applicable) on the echo rows: their reward is the spy's alone
    torch.testing.assert_close(batch.rewards, torch.tensor([0.0 + 1.0, 1.0 + 0.2, 2.0, 3.0]))


def test_prompt_column_is_optional_with_several_environments(tool_model, tool_tok, tmp_path):
    def length(completions, **kwargs):
        return [float(len(c)) for c in completions]

    data = Dataset.from_dict({"environment": ["echo", "counter"], "target": [None, 4]})
    trainer = ScriptedCalls(
        model=tool_model, reward_funcs=length, args=env_args(tmp_path, num_generations=2), train_dataset=data,
        processing_class=tool_tok, environment_factory={"counter": CounterEnv, "echo": EchoEnv},
    )  # fmt: skip
    trainer.train()
    rows = trainer._generate_and_score([{"environment": "echo", "target": None}] * 2, "eval")
    text = tool_tok.decode(rows.prompt_ids[0][rows.prompt_mask[0].bool()])
    assert text.endswith("<|im_start|>user\n Echo it.<|im_end|>\n<|im_start|>assistant\n")


def test_environment_errors(tool_model, tool_tok, tmp_path):
    def make(**kw):
        kw = {"model": tool_model, "processing_class": tool_tok, "args": env_args(tmp_path), **kw}
        return GRPOTrainer(**kw)

    with pytest.raises(ValueError, match="No reward source provided"):
        make(environment_factory=EchoEnv, train_dataset=counter_dataset(4))
    with pytest.raises(ValueError, match="No reward source provided"):
        make(train_dataset=counter_dataset(4))
    with pytest.raises(ValueError, match="must define a callable `reset`"):
        make(environment_factory=object, reward_funcs=lambda completions, **kw: [0.0] * len(completions))
    with pytest.raises(ValueError, match="requires a `train_dataset` with an `environment` column"):
        make(environment_factory={"counter": CounterEnv})
    with pytest.raises(ValueError, match="`max_steps` must be set to a positive value"):
        make(environment_factory=CounterEnv, args=env_args(tmp_path, max_steps=-1))
    bad = Dataset.from_dict({"environment": ["counter", "chess"], "target": [1, 2]})
    args = env_args(tmp_path, num_generations=2)
    trainer = make(environment_factory={"counter": CounterEnv}, train_dataset=bad, args=args)
    with pytest.raises(ValueError, match=r"`environment='chess'`, which is not among the environments"):
        trainer.train()


def test_experimental_warning_and_its_silencing(tool_model, tool_tok, tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    kwargs = dict(model=tool_model, processing_class=tool_tok, args=env_args(tmp_path), environment_factory=CounterEnv)
    with pytest.warns(UserWarning, match="'environment_factory', which is an experimental feature"):
        GRPOTrainer(**kwargs)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOTrainer(**kwargs)


def test_environment_example_runs_as_written(tmp_path, monkeypatch):
    import runpy
    import sys
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "grpo_environment.py"
    monkeypatch.setattr(sys, "argv", [str(example), str(tmp_path / "out")])
    trainer = runpy.run_path(str(example), run_name="__main__")["trainer"]
    assert trainer.reward_func_names == ["CounterEnv"]
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2]
