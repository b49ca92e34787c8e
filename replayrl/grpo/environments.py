"""Environments (TRL 1.16's `GRPOTrainer(environment_factory=...)`): stateful tools, environment-owned rewards
and environment-owned data, built on the trainer's tool calling (`replayrl.grpo.tools`).

The contract, as TRL's:
- `environment_factory` is a callable returning an environment instance, or a `{name: callable}` dict of several
  environments; with a dict, each example's `environment` column names its environment.
- An environment defines `reset(**example)`: called once per rollout with the example's columns (less
  `environment` with a dict); a string it returns is appended to the prompt's last user message.
- Its public methods (not `reset`, not `get_reward`, no leading `_`) are the model's tools for that rollout: their
  schema is rendered into the prompt, and the model's calls run on the rollout's own instance (one instance per
  rollout, pooled and reset across batches: "construct once, reset often").
- An optional `get_reward()` (sync or async) makes the environment own the reward: one extra reward function per
  environment class, named after the class, weight 1, None for rollouts of other environments; `reward_funcs` may
  then be omitted.
- With a single factory, `train_dataset` may be omitted (the environment owns the data, `reset` returns the prompt;
  `max_steps` sets the length): a placeholder dataset of empty user messages drives the loop.
Reward functions get the rollouts' instances as the `environments` keyword argument.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable
from typing import Any

from replayrl.data.prompts import prompts_to_text
from replayrl.grpo.tools import tools_by_name

EMPTY_PROMPT = [{"role": "user", "content": ""}]  # TRL's prompt of an example without one
_NOT_TOOLS = ("reset", "get_reward")


def experimental_warning(feature: str) -> None:
    """TRL's warning for its experimental GRPO features, silenced by TRL_EXPERIMENTAL_SILENCE=1."""
    if os.environ.get("TRL_EXPERIMENTAL_SILENCE", "0") != "1":
        warnings.warn(
            f"You are using '{feature}', which is an experimental feature. This API may change or be removed at "
            "any time without prior notice. Silence this warning by setting environment variable "
            "TRL_EXPERIMENTAL_SILENCE=1.",
            UserWarning,
            stacklevel=4,
        )


def build_environments(rollout_func, environment_factory, tools: list | None) -> Environments | None:
    """TRL's experimental-feature warnings, then the environments (None without `environment_factory`)."""
    for feature, value in (("rollout_func", rollout_func), ("environment_factory", environment_factory)):
        if value is not None:
            experimental_warning(feature)
    return None if environment_factory is None else Environments(environment_factory, list(tools or []))


def _tool_methods(instance) -> list[Callable]:
    """The instance's public methods, bound (listed on the class: getmembers on an instance evaluates properties)."""
    names = [n for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)]
    return [getattr(instance, n) for n in names if n not in _NOT_TOOLS and not n.startswith("_")]


def _reward_of(env_type: type) -> Callable:
    """A reward function scoring the rollouts whose environment is exactly `env_type` (None for the others)."""
    if inspect.iscoroutinefunction(env_type.get_reward):

        async def reward(environments=None, **kwargs):
            return [await e.get_reward() if type(e) is env_type else None for e in environments]

    else:

        def reward(environments=None, **kwargs):
            return [e.get_reward() if type(e) is env_type else None for e in environments]

    reward.__name__ = reward.__qualname__ = env_type.__name__
    return reward


class Environments:
    """The environments of a trainer: one probed instance per environment validates it and gives its tool
    schema; instances are pooled per environment and handed out one per rollout."""

    def __init__(self, factory: Callable | dict[str, Callable], tools: list[Callable]):
        self.multi = isinstance(factory, dict)
        self.factories: dict[str | None, Callable] = dict(factory) if self.multi else {None: factory}
        self.pool: dict[str | None, list] = {}
        self.schema_tools: dict[str | None, list[Callable]] = {}  # tools rendered in a prompt of that environment
        self.all_tools = list(tools)  # standalone tools + every environment's methods (TRL's `trainer.tools`)
        self.reward_funcs: list[Callable] = []
        self.standalone = list(tools)
        reward_types: list[type] = []
        for name, make in self.factories.items():
            if not callable(make):
                raise ValueError(f"environment_factory[{name!r}] must be a callable returning an environment.")
            instance = make()
            if not callable(getattr(instance, "reset", None)):
                raise ValueError(
                    "Each environment instance returned by `environment_factory` must define a callable `reset`."
                )
            methods = _tool_methods(instance)
            tools_by_name(self.standalone + methods)  # distinct names, or a ValueError naming the clash
            self.pool[name], self.schema_tools[name] = [instance], self.standalone + methods
            self.all_tools += [m for m in methods if m.__name__ not in {t.__name__ for t in self.all_tools}]
            owns_reward = callable(getattr(type(instance), "get_reward", None))
            if owns_reward and type(instance) not in reward_types:  # one per class (a dict may repeat a class)
                reward_types.append(type(instance))
                self.reward_funcs.append(_reward_of(type(instance)))

    def names_of(self, inputs: list[dict]) -> list[str | None]:
        """Each example's environment (its `environment` column with several environments)."""
        if not self.multi:
            return [None] * len(inputs)
        names = [x.get("environment") for x in inputs]
        for name in dict.fromkeys(names):
            if name not in self.factories:
                raise ValueError(
                    f"Example has `environment={name!r}`, which is not among the environments passed to "
                    f"`environment_factory`. Expected one of: {list(self.factories)}."
                )
        return names

    def assign(self, names: list[str | None]) -> list:
        """One pooled instance per rollout; the pool grows only when a batch needs more instances than exist."""
        handed: dict[str | None, int] = {}
        out = []
        for name in names:
            index = handed.get(name, 0)
            if index == len(self.pool[name]):
                self.pool[name].append(self.factories[name]())
            handed[name] = index + 1
            out.append(self.pool[name][index])
        return out

    def reset(self, instances: list, inputs: list[dict], prompts: list) -> list:
        """Reset every rollout's environment with its example; returns the prompts with the observations appended
        to the last message (a new list: the examples are left untouched)."""
        out = []
        for prompt, env, example in zip(prompts, instances, inputs):
            kwargs = {k: v for k, v in example.items() if k != "environment"} if self.multi else example
            out.append(_with_observation(prompt, env.reset(**kwargs)))
        return out

    def row_tools(self, instances: list) -> list[dict[str, Callable]]:
        """The callable tools of each rollout: the standalone tools and its own instance's methods."""
        return [tools_by_name(self.standalone + _tool_methods(env)) for env in instances]


def _with_observation(prompt, observation):
    if observation is None:
        return prompt
    if isinstance(prompt, str):  # a plain-text prompt (TRL's environments expect chats): append to the text
        return prompt + str(observation)
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return prompt[:-1] + [{**prompt[-1], "content": content + observation}]


def environment_rewards(envs: Environments | None, reward_funcs: Any, processing_classes: Any, weights):
    """`reward_funcs`, `reward_processing_classes` and `reward_weights` with the environments' own rewards
    appended (weight 1, no processing class), as TRL does; TRL's error when there is no reward source."""
    funcs = _as_list(reward_funcs)
    extra = envs.reward_funcs if envs is not None else []
    if not funcs and not extra:
        raise ValueError(
            "No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose environment "
            "defines a `get_reward` method."
        )
    if not extra:
        return funcs, processing_classes, weights
    if processing_classes is not None:
        processing_classes = _as_list(processing_classes) + [None] * len(extra)
    if weights is not None and len(weights) == len(funcs):
        weights = [*weights, *[1.0] * len(extra)]
    return funcs + extra, processing_classes, weights


def _as_list(value) -> list:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def environment_dataset(envs: Environments | None, train_dataset, args, optional: bool = False):
    """The training data: the given dataset, or, when the environment owns the data, TRL's placeholder of empty
    prompts (one generation batch of rows, cycled), after TRL's checks. `optional`: a trainer that may be built
    without data (then `train()` refuses)."""
    if train_dataset is not None or (envs is None and optional):
        return train_dataset
    if envs is None:  # TRL 1.16 refuses this at construction too
        raise ValueError(
            "`train_dataset` is required unless an `environment_factory` is provided: pass train_dataset=<a Dataset "
            "or IterableDataset with a 'prompt' column>."
        )
    if envs.multi:
        raise ValueError(
            "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
            "`environment` column to route each example to its environment. Provide a dataset, or pass a "
            "single environment factory."
        )
    if args.max_steps <= 0:
        raise ValueError(
            "When training without a `train_dataset` (the environment owns the data and returns the prompt "
            "from `reset()`), `max_steps` must be set to a positive value to define the training length. Set "
            "it via `GRPOConfig(max_steps=...)`."
        )
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [EMPTY_PROMPT] * (args.generation_batch_size // args.num_generations)})


class EnvironmentMixin:
    """GRPOTrainer's environment hooks (a mixin of the trainer: uses `_env`, `processing_class`, `args`, `tools`)."""

    _env: Environments | None = None
    environments: list | None = None  # this batch's instance per rollout (TRL's attribute)

    @property
    def environment_factories(self) -> dict | None:
        """TRL's attribute: `{name: factory}`; a single factory is `{None: factory}`."""
        return None if self._env is None else self._env.factories

    @property
    def _env_tools(self) -> dict:  # TRL's private attributes, read by TRL's tests
        return {} if self._env is None else self._env.schema_tools

    @property
    def _environment_pool(self) -> dict:
        return {} if self._env is None else self._env.pool

    def _rollout_prompts(self, inputs: list[dict]) -> tuple[list, dict[str, list]]:
        """The batch's prompts and the columns passed to the reward functions. With environments: each rollout's
        environment is reset (its observation appended to the prompt) and the instances join the columns."""
        prompts = [x.get("prompt", EMPTY_PROMPT) if self._env else x["prompt"] for x in inputs]
        columns = {k: [x.get(k) for x in inputs] for k in inputs[0] if k != "prompt"}
        if self._env is None:
            return prompts, columns
        self._batch_environments = self._env.names_of(inputs)
        self.environments = self._env.assign(self._batch_environments)
        columns["environments"] = self.environments
        return self._env.reset(self.environments, inputs, prompts), columns

    def _prompt_texts(self, prompts: list) -> list[str]:
        """Prompts as text, each rendered with the tools of its own environment."""
        kwargs = self.args.chat_template_kwargs
        if self._env is None:
            return prompts_to_text(self.processing_class, prompts, kwargs, self.tools)
        tools = [self._env.schema_tools[name] for name in self._batch_environments]
        return [prompts_to_text(self.processing_class, [p], kwargs, t)[0] for p, t in zip(prompts, tools)]

    def _tools_per_row(self):
        """The tools the tool loop runs: one dict for every row, or (environments) one dict per row."""
        return self._tools if self._env is None else self._env.row_tools(self.environments)
