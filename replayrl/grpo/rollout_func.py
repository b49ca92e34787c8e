"""`rollout_func` (TRL 1.16's `GRPOTrainer(rollout_func=...)`): the user's function replaces generation.

`rollout_func(prompts, trainer) -> dict` gets the process's prompts of the batch (each dataset prompt already
repeated `num_generations` times, consecutively; conversational prompts as messages: templating is the function's
job) and returns one row per prompt:
- `prompt_ids`, `completion_ids`: lists of token ids; `logprobs`: the sampler's log-prob of each completion token
  (None for an unknown one). Required: TRL's error names the missing keys.
- `env_mask` (optional): 1 on the tokens the model generated, 0 on those the environment inserted (observations,
  tool output): the latter get no loss and no ratio (replayrl's `tool_mask`).
- any other key is an extra field for the reward functions: a list gives each row its entry, anything else is
  given to every row (TRL's rule); extra fields replace dataset columns of the same name.
The log-probs are the behaviour policy's own, as the sampler reported them: they are kept in the `Rollout` as
`engine_logps` (stored and replayed with their group by the replay buffer) and used as TRL uses them (the
`vllm_importance_sampling_*` correction with `use_vllm`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping

import torch
from torch import Tensor

from replayrl.grpo.generation import Generated, finish_generation, sync_generator

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")


def run_rollout_func(trainer, prompts: list, mode: str) -> Generated:
    """Call `trainer.rollout_func`, check its output and turn it into a padded `Generated` batch."""
    if trainer.args.use_vllm:  # keep the engine's weights current for rollouts that use the trainer's vLLM
        sync_generator(trainer, trainer.accelerator.unwrap_model(trainer.model))
    start = time.perf_counter()
    output = trainer.rollout_func(copy.deepcopy(prompts), trainer)
    trainer._metrics[mode]["timing/generation"].append(time.perf_counter() - start)
    if not isinstance(output, Mapping):
        raise ValueError(f"rollout_func must return a dict, got {type(output).__name__}.")
    missing = sorted(set(REQUIRED_KEYS) - output.keys())
    if missing:
        raise ValueError(f"rollout_func must return keys {missing} in its output dict.")
    extra = {k: v for k, v in output.items() if k not in REQUIRED_KEYS}
    env_mask = None if trainer.tools else extra.pop("env_mask", None)  # with tools, the tool loop owns the mask
    prompt_ids, completion_ids = _id_lists(output["prompt_ids"]), _id_lists(output["completion_ids"])
    logprobs = [[math.nan if v is None else float(v) for v in _row(r)] for r in output["logprobs"]]
    _check_rows(len(prompts), prompt_ids, completion_ids, logprobs, env_mask)
    device, pad = trainer.accelerator.device, trainer.generation_config.pad_token_id
    p_ids, p_mask = trainer._pad_to_multiple(*_pad(prompt_ids, pad, "left", torch.long), "left")
    c_ids, c_mask = _pad(completion_ids, pad, "right", torch.long)
    gen = Generated(
        prompt_ids=p_ids.to(device),
        prompt_mask=p_mask.to(device),
        completion_ids=c_ids.to(device),
        completion_mask=c_mask.to(device),
        truncated=torch.tensor([_truncated(ids, trainer) for ids in completion_ids], device=device),
        engine_logps=_pad(logprobs, 0.0, "right", torch.float32)[0].to(device),
        tool_mask=None if env_mask is None else _pad([_row(m) for m in env_mask], 1, "right", torch.long)[0].to(device),
        extra={k: _per_row(v, len(prompts)) for k, v in extra.items()},
    )
    return finish_generation(trainer, gen, mode)


def _row(values) -> list:
    return values.tolist() if isinstance(values, Tensor) else list(values)


def _id_lists(rows) -> list[list[int]]:
    return [[int(t) for t in _row(r)] for r in rows]


def _per_row(values, n: int) -> list:
    """TRL's rule for extra fields: a list gives row i its entry i; anything else is the same for every row."""
    if isinstance(values, list):
        return [values[i] if i < len(values) else None for i in range(n)]
    return [values] * n


def _check_rows(n: int, prompt_ids, completion_ids, logprobs, env_mask) -> None:
    for key, rows in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids), ("logprobs", logprobs)):
        if len(rows) != n:
            raise ValueError(
                f"rollout_func returned {len(rows)} {key} for {n} prompts; return one row per prompt it was given "
                "(the prompts already repeat each dataset prompt num_generations times)."
            )
    for i, (ids, lp) in enumerate(zip(completion_ids, logprobs)):
        if len(lp) != len(ids):
            raise ValueError(
                f"rollout_func row {i}: {len(lp)} logprobs for {len(ids)} completion_ids; give one log-prob per "
                "completion token (None where unknown)."
            )
        if env_mask is not None and len(_row(env_mask[i])) != len(ids):
            raise ValueError(
                f"rollout_func row {i}: env_mask has {len(_row(env_mask[i]))} entries for {len(ids)} completion_ids; "
                "give one 0/1 per completion token (1 = generated by the model)."
            )
        if not prompt_ids[i]:
            raise ValueError(f"rollout_func row {i} has empty prompt_ids; the model needs a context to score from.")


def _pad(rows: list[list], value, side: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Rows of unequal length -> (N, W) values and mask, padded on `side`."""
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        cols = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        if r:
            out[i, cols] = torch.tensor(r, dtype=dtype)
            mask[i, cols] = 1
    return out, mask


def _truncated(ids: list[int], trainer) -> bool:
    """TRL's rule: a completion is truncated when its last token is neither EOS nor padding."""
    config = trainer.generation_config
    eos = config.eos_token_id
    stops = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {config.pad_token_id}
    return bool(ids) and ids[-1] not in stops
