"""Reward functions: TRL's calling convention, reward models, and the checks on what they return.

A reward function is called with keyword arguments `prompts`, `completions`, `completion_ids`,
`trainer_state` and one list per extra dataset column, and returns one float (or None: "does not
apply") per completion. A reward model is a sequence-classification model scoring prompt + completion.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

from replayrl.models.loading import load_model, load_tokenizer

RewardFunc = Callable[..., list[float | None]]
logger = logging.getLogger(__name__)
# Keyword arguments the trainer passes besides the dataset columns (TRL's names).
STANDARD_KWARGS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"})


def reward_func_name(func: Any) -> str:
    """The metric name of a reward: the function's `__name__`, or the reward model's name."""
    if isinstance(func, PreTrainedModel):
        return func.config._name_or_path.split("/")[-1] or type(func).__name__
    return getattr(func, "__name__", type(func).__name__)


def load_reward_model(name: str, model_init_kwargs: dict | None = None) -> PreTrainedModel:
    """A reward model by name or path: a one-label sequence classifier, through the one loading path (float32
    unless `model_init_kwargs` name a dtype)."""
    return load_model(name, model_init_kwargs, architecture="reward", role="reward model")


class RewardFunctions:
    """The reward functions of a trainer: resolves models/tokenizers, calls all of them, validates output."""

    def __init__(
        self,
        funcs: Any,
        processing_classes: Any = None,
        weights: Sequence[float] | None = None,
        model_init_kwargs: dict | None = None,
    ):
        funcs = list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
        if not funcs:
            raise ValueError("reward_funcs is empty: pass at least one reward function or reward model.")
        self.funcs = [load_reward_model(f, model_init_kwargs) if isinstance(f, str) else f for f in funcs]
        for f in self.funcs:
            if not (callable(f) or isinstance(f, PreTrainedModel)):
                raise ValueError(f"Reward {f!r} is neither a callable, a model, nor a model name/path.")
        self.names = [reward_func_name(f) for f in self.funcs]
        self.processing_classes = self._resolve_processing_classes(processing_classes)
        if weights is None:
            weights = [1.0] * len(self.funcs)
        if len(weights) != len(self.funcs):
            raise ValueError(
                f"reward_weights has {len(weights)} entries but there are {len(self.funcs)} reward functions "
                f"({self.names}); give one weight per function."
            )
        self.weights = torch.tensor([float(w) for w in weights], dtype=torch.float32)

    def _resolve_processing_classes(self, classes: Any) -> list:
        if classes is None:
            classes = [None] * len(self.funcs)
        elif not isinstance(classes, (list, tuple)):
            classes = [classes]
        if len(classes) != len(self.funcs):
            raise ValueError(
                f"The number of reward_processing_classes must match the number of reward functions: got "
                f"{len(classes)} entries for {len(self.funcs)} reward functions."
            )
        resolved = []
        for func, tok in zip(self.funcs, classes):
            if isinstance(func, PreTrainedModel):
                tok = load_tokenizer(tok, func)
                func.config.pad_token_id = tok.pad_token_id
            resolved.append(tok)
        return resolved

    def columns_used(self) -> set[str]:
        """Dataset columns the reward functions name as parameters (besides the standard ones)."""
        standard = STANDARD_KWARGS | {"environments", "kwargs", "self"}
        used = set()
        for func in self.funcs:
            if isinstance(func, PreTrainedModel):
                continue
            params = inspect.signature(func).parameters.values()
            used |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - standard
        return used

    def columns_required(self) -> dict[str, set[str]]:
        """Per function name, the dataset columns it cannot do without: parameters with no default, and those
        it declares in a `required_columns` attribute."""
        standard = STANDARD_KWARGS | {"environments"}
        required = {}
        for name, func in zip(self.names, self.funcs):
            if isinstance(func, PreTrainedModel):
                continue
            params = inspect.signature(func).parameters.values()
            named = {
                p.name for p in params if p.default is p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            }
            required[name] = (named | set(getattr(func, "required_columns", ()))) - standard
        return required

    def __len__(self) -> int:  # TRL's `trainer.reward_funcs` is the list of functions
        return len(self.funcs)

    def __getitem__(self, index):
        return self.funcs[index]

    def __iter__(self):
        return iter(self.funcs)

    def models(self) -> list[PreTrainedModel]:
        return [f for f in self.funcs if isinstance(f, PreTrainedModel)]

    def __call__(
        self,
        prompts: list,
        completions: list,
        completion_ids: list[list[int]],
        columns: dict[str, list],
        trainer_state: Any = None,
        device: torch.device | str = "cpu",
        **extra_kwargs: Any,
    ) -> Tensor:
        """Scores of every function: (N, F) float32 on `device`, NaN where a function returned None.
        ``extra_kwargs`` (TRL's ``log_extra`` / ``log_metric`` callbacks, ...) are passed to every function."""
        n = len(completions)
        kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **columns}
        kwargs.update(trainer_state=trainer_state, **extra_kwargs)
        results: list[Any] = [None] * len(self.funcs)
        pending = {}
        for i, func in enumerate(self.funcs):
            if isinstance(func, PreTrainedModel):
                results[i] = self._score_with_model(func, self.processing_classes[i], prompts, completions)
            elif inspect.iscoroutinefunction(func):
                pending[i] = func
            else:
                results[i] = func(**kwargs)
        if pending:
            outputs = dict(zip(pending, _run_async([f(**kwargs) for f in pending.values()])))
            results = [outputs.get(i, r) for i, r in enumerate(results)]
        columns_out = torch.stack([self._validate(name, out, n) for name, out in zip(self.names, results)], dim=1)
        _warn_unscored(columns_out, prompts, completions, columns)
        return columns_out.to(device)

    @staticmethod
    def _validate(name: str, out: Any, n: int) -> Tensor:
        if isinstance(out, Tensor) or type(out).__module__ == "numpy":  # tensors and numpy arrays, as TRL
            out = out.tolist()
        if not isinstance(out, (list, tuple)):
            raise ValueError(
                f"Reward function {name!r} returned {type(out).__name__} {out!r}; it must return a list of {n} "
                "floats (one per completion, None where it does not apply)."
            )
        if len(out) != n:
            raise ValueError(  # TRL's wording
                f"The reward function {name!r} returned {len(out)} rewards, but {n} were expected (one per "
                "prompt-completion pair). Make sure the reward function returns exactly one reward per completion."
            )
        values = []
        for i, v in enumerate(out):
            if v is None:
                values.append(math.nan)
                continue
            if isinstance(v, str) or not hasattr(v, "__float__"):  # numbers, bools, numpy/torch scalars
                raise ValueError(
                    f"Reward function {name!r} returned {v!r} ({type(v).__name__}) at index {i}; "
                    "rewards must be numbers or None."
                )
            v = float(v)
            if not math.isfinite(v):
                raise ValueError(
                    f"Reward function {name!r} returned {v} at index {i}; rewards must be finite "
                    "(return None to skip a sample)."
                )
            values.append(v)
        return torch.tensor(values, dtype=torch.float32)

    @torch.no_grad()
    def _score_with_model(self, model: PreTrainedModel, tokenizer, prompts: list, completions: list) -> list[float]:
        if isinstance(prompts[0], list):  # conversational: score the whole chat
            texts = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
        else:
            texts = [p + c for p, c in zip(prompts, completions)]
        device = next(model.parameters()).device
        enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
        return logits[:, 0].float().tolist()

    def combine(self, per_func: Tensor) -> Tensor:
        """Weighted sum over functions, ignoring None (NaN) entries: (N, F) -> (N,). A row that no function
        scored stays NaN (it gets zero advantage)."""
        weighted = per_func * self.weights.to(per_func.device)
        total = weighted.nansum(dim=1)
        return torch.where(per_func.isnan().all(dim=1), torch.full_like(total, math.nan), total)


def _warn_unscored(per_func: Tensor, prompts: list, completions: list, columns: dict[str, list]) -> None:
    """TRL's warning when every reward function returned None for a sample, naming the first such sample."""
    unscored = per_func.isnan().all(dim=1)
    if not unscored.any():
        return
    i = int(unscored.nonzero()[0])
    row = {key: values[i] for key, values in columns.items()}
    row.update(prompt=prompts[i], completion=completions[i])
    logger.warning(
        f"All reward functions returned None for the following kwargs:\n{row}\n"
        "Please ensure that at least one reward function returns a valid reward."
    )


def _run_async(coroutines: list) -> list:
    """Run async reward functions concurrently, also when called from inside a running event loop."""

    async def gather():
        return await asyncio.gather(*coroutines)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, gather()).result()
