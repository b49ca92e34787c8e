"""`PPOTrainer`: TRL v0.7.1's PPO with a value head and a user-written loop, on accelerate.

    for batch in ppo_trainer.dataloader:
        responses = ppo_trainer.generate(batch["input_ids"], return_prompt=False, **generation_kwargs)
        scores = [my_reward(q, r) for q, r in ...]          # any Python: a list of scalars
        stats = ppo_trainer.step(batch["input_ids"], responses, scores)
        ppo_trainer.log_stats(stats, batch, scores)

What one `step` runs (math in `replayrl.algos.ppo`): scores scaled/normalised/clipped if asked; one no-grad
forward pass of the policy (log-probs, values) and of the reference (log-probs); per-token rewards
``-beta * KL_t`` plus the score on the last response token; GAE advantages (whitened) and returns; then
``ppo_epochs`` passes over shuffled mini-batches with the clipped policy loss + clipped value loss, one optimizer
step per ``gradient_accumulation_steps`` mini-batches; early stop on ``target_kl``; the KL controller update.
`train()` (beyond TRL v0.7.1) runs generate -> reward functions -> step itself: `replayrl.ppo.loop`.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch import Tensor
from transformers import PreTrainedModel

from replayrl.algos import ppo as F
from replayrl.generation.hf import sampling_mode
from replayrl.metrics import METRICS_FILE, MetricsFile
from replayrl.models.prompt_learning import refuse_prompt_learning
from replayrl.models.sharding import needs_synced_gpus, prepare_frozen_model, zero_stage
from replayrl.ppo.batch import PPOBatch, batch_to, batched_forward, build_batch, forward
from replayrl.ppo.config import PPOConfig
from replayrl.ppo.seed_methods import PPOSeedMethodsMixin
from replayrl.ppo.seq2seq_batch import pad_right
from replayrl.ppo.sharding import configure_deepspeed, engine_backward, generation_context, is_deepspeed
from replayrl.ppo.stats import gather_stats, log_stats_record, step_stats

ROLLOUT_KEYS = ("logprobs", "values", "advantages", "returns")


def dict_collator(rows: list[dict]) -> dict[str, list]:
    """TRL v0.7.1's recommended collator: a dict of lists (variable-length queries stay separate tensors)."""
    return {key: [row[key] for row in rows] for key in rows[0]}


def default_collator(rows: list):
    """The collator of ``data_collator=None``: dict rows -> `dict_collator`; any other rows (a tuple
    ``(query_tensor, response_tensor)`` per row, as in TRL v0.7.1's own tests) -> torch's default collation,
    which is what TRL v0.7.1's DataLoader applies to them."""
    if isinstance(rows[0], dict):
        return dict_collator(rows)
    return torch.utils.data.default_collate(rows)


class LengthSampler:
    """Samples an integer in ``[min_value, max_value)``: pass as ``length_sampler`` to vary response lengths."""

    def __init__(self, min_value: int, max_value: int):
        self.values = list(range(min_value, max_value))

    def __call__(self) -> int:
        return self.values[int(torch.randint(len(self.values), ()).item())]


class PPOTrainer(PPOSeedMethodsMixin):
    """PPO for causal LMs with a value head; arguments as TRL v0.7.1's `PPOTrainer` (see `docs/ppo.md`)."""

    def __init__(
        self,
        config: PPOConfig | None = None,
        model=None,
        ref_model=None,
        tokenizer=None,
        dataset=None,
        optimizer: torch.optim.Optimizer | None = None,
        data_collator=None,
        num_shared_layers: int | None = None,
        lr_scheduler=None,
    ):
        from replayrl.models.value_head import (
            AutoModelForCausalLMWithValueHead,
            AutoModelForSeq2SeqLMWithValueHead,
            create_reference_model,
        )

        self.config = config = config or PPOConfig()
        if model is None or tokenizer is None:
            raise ValueError("PPOTrainer needs `model` (AutoModelForCausalLMWithValueHead) and `tokenizer`.")
        if isinstance(model, (str, PreTrainedModel)):  # convenience: wrap a plain causal LM
            model = AutoModelForCausalLMWithValueHead.from_pretrained(model)
        if not isinstance(model, AutoModelForCausalLMWithValueHead):
            raise ValueError(f"model is a {type(model).__name__}; pass an AutoModelForCausalLMWithValueHead.")
        self.is_encoder_decoder = isinstance(model, AutoModelForSeq2SeqLMWithValueHead)
        if ref_model is not None and num_shared_layers is not None:
            warnings.warn(  # TRL v0.7.1's warning, in its words
                "num_shared_layers is ignored when ref_model is provided. Two different models are used for the "
                "model and the reference model and no layers are shared.",
                UserWarning,
                stacklevel=2,
            )
            num_shared_layers = None
        if dataset is None:
            warnings.warn(  # TRL v0.7.1's warning, in its words
                "No dataset is provided. Make sure to set config.batch_size to the correct value before training.",
                UserWarning,
                stacklevel=2,
            )
        refuse_prompt_learning(
            model,
            "PPOTrainer",
            "its value head and rollouts read the policy at fixed response positions, and the generation backends "
            "sample with merged weights, into which a soft prompt or prefix cannot be merged",
        )
        set_seed(config.seed)
        self.accelerator = Accelerator(
            log_with=config.log_with,
            project_config=ProjectConfiguration(**config.project_kwargs),
            **config.accelerator_kwargs,
        )
        self.is_distributed = self.accelerator.num_processes > 1
        self.is_deepspeed = is_deepspeed(self.accelerator)
        configure_deepspeed(self.accelerator, config, num_shared_layers)
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.is_peft_model = model.is_peft_model
        if ref_model is None and not self.is_peft_model:
            ref_model = create_reference_model(model, num_shared_layers)
        self.ref_model = None if ref_model is None else ref_model.eval().to(self.accelerator.device)
        if optimizer is None:
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.Adam(params, lr=config.learning_rate)
        self.dataset, self.data_collator = dataset, data_collator
        dataloader = self.prepare_dataloader(dataset, data_collator) if dataset is not None else None
        self.model, self.optimizer, self.lr_scheduler = self.accelerator.prepare(model, optimizer, lr_scheduler)
        if self.ref_model is not None and zero_stage(self.accelerator) == 3:  # TRL's partitioned inference engine
            self.ref_model = prepare_frozen_model(self.ref_model, self.accelerator)
        self.dataloader = self.accelerator.prepare(dataloader) if dataloader is not None else None
        self.kl_ctl = (
            F.AdaptiveKLController(config.init_kl_coef, config.target, config.horizon)
            if config.adap_kl_ctrl
            else F.FixedKLController(config.init_kl_coef)
        )
        self.running = F.RunningMoments()
        # Mini-batch shuffling has its own generator (per process), so a checkpoint can restore it exactly.
        self.shuffle_generator = torch.Generator().manual_seed(config.seed + self.accelerator.process_index)
        self.current_step = 0
        self.minibatch_stats: list[dict[str, float]] = []
        if config.log_with is not None:
            init = config.tracker_kwargs
            self.accelerator.init_trackers(config.tracker_project_name, config=_flat_config(config), init_kwargs=init)

    # ------------------------------------------------------------------------------------------ data
    def prepare_dataloader(self, dataset, data_collator=None) -> torch.utils.data.DataLoader:
        """Shuffled, ``drop_last`` DataLoader of ``config.batch_size`` rows; an HF dataset loses the columns no
        model input uses when ``remove_unused_columns`` (keeps input_ids, attention_mask, label, query, response)."""
        import datasets

        if isinstance(dataset, datasets.Dataset) and self.config.remove_unused_columns:
            keep = {"input_ids", "attention_mask", "label", "query", "response"}
            if keep & set(dataset.column_names):  # a prompt-only dataset (for train()) keeps its columns
                dataset = dataset.remove_columns([c for c in dataset.column_names if c not in keep])
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=self.config.batch_size,
            collate_fn=data_collator or default_collator,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(self.config.seed),
        )

    # ------------------------------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        query_tensor: Tensor | list[Tensor],
        length_sampler=None,
        batch_size: int = 4,
        return_prompt: bool = True,
        **generation_kwargs,
    ):
        """Sample responses. One query ``(L,)`` -> ``(1, L + new)`` tensor; a list of queries -> a list of 1-D
        tensors (prompt and padding removed when ``return_prompt=False``, cut after the first EOS), generated
        ``batch_size`` at a time with left padding. ``length_sampler()`` gives ``max_new_tokens`` per batch."""
        generation_kwargs.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        with self.unwrap_for_generation() as model, sampling_mode(model):  # eval mode, no MoE router logits
            # sharded weights: every process joins every forward pass (ZeRO-3 without gathering, FSDP2)
            generation_kwargs.setdefault("synced_gpus", needs_synced_gpus(model) or None)
            if isinstance(query_tensor, Tensor) and query_tensor.dim() == 1:
                if length_sampler is not None:
                    generation_kwargs["max_new_tokens"] = length_sampler()
                ids = query_tensor.unsqueeze(0).to(self.accelerator.device)
                response = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **generation_kwargs)
                if self.is_encoder_decoder:  # the decoder's ids (start token first): there is no prompt in them
                    return response
                return response if return_prompt else response[:, ids.shape[1] :]
            return self._generate_batched(
                model, list(query_tensor), length_sampler, batch_size, return_prompt, generation_kwargs
            )

    def unwrap_for_generation(self):
        """The policy to sample from: under ZeRO-3 with ``ds3_gather_for_generation`` its parameters gathered for
        the block, under FSDP2 the wrapper's own group unsharded (`replayrl.ppo.sharding.generation_context`)."""
        return generation_context(self.model, self.accelerator, self.config.ds3_gather_for_generation)

    def _generate_batched(self, model, queries, length_sampler, batch_size, return_prompt, kwargs) -> list[Tensor]:
        outputs, pad, eos = [], self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        for start in range(0, len(queries), batch_size):
            if length_sampler is not None:
                kwargs["max_new_tokens"] = length_sampler()
            chunk = [q.to(self.accelerator.device) for q in queries[start : start + batch_size]]
            if self.is_encoder_decoder:  # right-padded encoder inputs; the output is the decoder's ids
                ids, attention = pad_right(chunk, pad)
                generated = model.generate(input_ids=ids, attention_mask=attention, **kwargs)
                width, return_prompt = 0, False
            else:
                batch = build_batch(chunk, [q[:0] for q in chunk], pad)  # left-padded queries, empty responses
                generated = model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kwargs)
                width = batch.input_ids.shape[1]
            for row, query in zip(generated, chunk):
                response = row[width:]
                if eos is not None and (response == eos).any():
                    response = response[: int((response == eos).nonzero()[0]) + 1]
                outputs.append(torch.cat([query, response]) if return_prompt else response)
        return outputs

    # ------------------------------------------------------------------------------------------ step
    def step(
        self,
        queries: list[Tensor],
        responses: list[Tensor],
        scores: list[Tensor] | list[float] | Tensor,
        response_masks: list[Tensor] | None = None,
    ) -> dict:
        """One PPO step on ``batch_size`` (query, response, score) triples; returns TRL v0.7.1's stats dict."""
        t_start = time.time()
        scores = self._check_inputs(queries, responses, scores, response_masks)
        timing = {}
        scores = self._scale_scores(scores)
        device = self.accelerator.device
        batch = batch_to(self._build_batch(queries, responses, response_masks), device)
        t = time.time()
        old, ref = self._rollout_forward(batch)
        timing["time/ppo/forward_pass"] = time.time() - t
        t = time.time()
        mask, kl_coef = batch.response_mask, self.kl_ctl.value
        # TRL v0.7.1's PPOTrainer methods (overridable): kl_penalty "full" hands them the (B, T, V) distributions
        kl_inputs = (
            (old.full_logprobs, ref.full_logprobs) if old.full_logprobs is not None else (old.logprobs, ref.logprobs)
        )
        with torch.no_grad():
            kl = self._kl_penalty(*kl_inputs)  # for the stats
            rewards, non_score = self.compute_rewards(scores.to(device), *kl_inputs, mask)
        timing["time/ppo/compute_rewards"] = time.time() - t
        t = time.time()
        with torch.no_grad():
            values, advantages, returns = self.compute_advantages(old.values, rewards, mask)
        timing["time/ppo/compute_advantages"] = time.time() - t
        t = time.time()
        rollout = {"logprobs": old.logprobs, "values": values, "advantages": advantages, "returns": returns}
        train_stats = self._optimize(batch, rollout)
        timing["time/ppo/optimize_step"] = time.time() - t
        t = time.time()
        data = {"scores": scores, "logprobs": old.logprobs, "ref_logprobs": ref.logprobs, "kls": kl, "mask": mask}
        stats = step_stats(data, non_score, train_stats, kl_coef, queries, responses)
        stats = gather_stats(self.accelerator, stats)
        self.kl_ctl.update(stats["objective/kl"], self.config.batch_size * self.accelerator.num_processes)
        stats["ppo/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        timing["time/ppo/calc_stats"] = time.time() - t
        timing["time/ppo/total"] = time.time() - t_start
        stats.update(timing)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.current_step += 1
        return stats

    def _step_safety_checker(self, batch_size: int, queries, responses, scores, masks=None):
        """TRL v0.7.1's check of `step`'s inputs (`_check_inputs`, against ``batch_size``): returns ``(queries,
        responses, scores, masks)`` on the accelerator's device, each score a 0-d float tensor."""
        checked = self._check_inputs(queries, responses, scores, masks, batch_size)
        device = self.accelerator.device
        masks = [m.to(device) for m in masks] if masks is not None else None
        return [q.to(device) for q in queries], [r.to(device) for r in responses], list(checked.to(device)), masks

    def _check_inputs(self, queries, responses, scores, response_masks, batch_size: int | None = None) -> Tensor:
        """TRL v0.7.1's safety checks, with fix-it messages; returns the scores as a float32 ``(B,)`` tensor."""
        n = self.config.batch_size if batch_size is None else batch_size
        named = [("queries", queries), ("responses", responses), ("scores", scores)]
        named += [("response_masks", response_masks)] if response_masks is not None else []
        for name, value in named:
            if len(value) != n:
                raise ValueError(
                    f"{name} has {len(value)} entries but config.batch_size is {n}; pass exactly batch_size "
                    "samples per step (or set PPOConfig(batch_size=...) to your batch size)."
                )
        for name, tensors in named[:2]:
            for i, t in enumerate(tensors):
                if not isinstance(t, Tensor) or t.dim() != 1 or t.numel() == 0:
                    raise ValueError(f"{name}[{i}] must be a non-empty 1-D tensor of token ids, got {_describe(t)}.")
        for i, score in enumerate(scores):
            if isinstance(score, Tensor) and score.dim() > 1:  # as TRL v0.7.1: a (1, 1) score is not taken
                raise ValueError(
                    f"scores[{i}] has shape {tuple(score.shape)}: scores must be 1-dimensional, one scalar per "
                    "sample (a 0-d tensor, a float, or a 1-element 1-D tensor)."
                )
        try:
            scores = torch.stack([torch.as_tensor(s, dtype=torch.float32).reshape(()) for s in scores]).cpu()
        except (RuntimeError, TypeError, ValueError) as err:
            raise ValueError(f"scores must be one scalar (float or 0-d tensor) per sample: {err}") from err
        if not torch.isfinite(scores).all():
            raise ValueError(f"scores must be finite, got {scores.tolist()}.")
        for i, (r, m) in enumerate(zip(responses, response_masks or responses)):
            if response_masks is not None and (len(m) != len(r) or not m.bool().any()):
                raise ValueError(f"response_masks[{i}] must match responses[{i}] in length and keep >= 1 token.")
        return scores

    def _scale_scores(self, scores: Tensor) -> Tensor:
        config = self.config
        if config.use_score_scaling:
            self.running.update(scores)
            factor = self.running.std + torch.finfo(torch.float32).eps
            scores = (scores - self.running.mean) / factor if config.use_score_norm else scores / factor
        if config.score_clip is not None:
            scores = scores.clamp(-config.score_clip, config.score_clip)
        return scores.float()

    def _rollout_forward(self, batch: PPOBatch):
        """No-grad log-probs and values of the policy, log-probs of the reference (PEFT: adapters disabled)."""
        config, full = self.config, self.config.kl_penalty == "full"
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()  # no dropout anywhere (arXiv:2403.17031): the first mini-batch then has ratio exactly 1
        try:
            old = batched_forward(model, batch, config.mini_batch_size, config.temperature, full)
            if self.ref_model is not None:
                ref = batched_forward(self.ref_model, batch, config.mini_batch_size, config.temperature, full)
            else:
                with model.pretrained_model.disable_adapter():
                    ref = batched_forward(model, batch, config.mini_batch_size, config.temperature, full)
        finally:
            model.train(was_training)
        return old, ref

    def _optimize(self, batch: PPOBatch, rollout: dict[str, Tensor]) -> list[dict[str, float]]:
        """``ppo_epochs`` passes over shuffled mini-batches; early stop per epoch on ``1.5 * target_kl``."""
        config, n = self.config, batch.input_ids.shape[0]
        self.minibatch_stats = []
        for _ in range(config.ppo_epochs):
            order = torch.randperm(n, generator=self.shuffle_generator).to(batch.input_ids.device)
            for k, start in enumerate(range(0, n, config.mini_batch_size)):
                rows = order[start : start + config.mini_batch_size]
                # an optimizer step every gradient_accumulation_steps mini-batches (batch_size is a multiple)
                sync = (k + 1) % config.gradient_accumulation_steps == 0
                no_sync = not sync and self.is_distributed and not self.is_deepspeed  # ZeRO-2/3 has no no_sync
                with self.accelerator.no_sync(self.model) if no_sync else nullcontext():
                    self.minibatch_stats.append(self.train_minibatch(batch.select(rows), rollout, rows, sync))
            if config.early_stopping and self._early_stop(self.minibatch_stats[-1]["policy/policykl"]):
                break
        return self.minibatch_stats

    def _early_stop(self, policykl: float) -> bool:
        """Stop when ``policykl > 1.5 * target_kl`` on any process (all processes stop together, as TRL v0.7.1)."""
        flag = torch.tensor(float(policykl > 1.5 * self.config.target_kl), device=self.accelerator.device)
        if self._reduce_sum(flag).item() > 0:
            self.optimizer.zero_grad()
            return True
        return False

    def train_minibatch(
        self, batch: PPOBatch, rollout: dict[str, Tensor], rows: Tensor, sync: bool = True
    ) -> dict[str, float]:
        """Loss, backward and (when ``sync``: the last mini-batch of an accumulation) an optimizer step."""
        config, mask = self.config, batch.response_mask
        width = mask.shape[1]
        old = {k: rollout[k][rows, :width] for k in ROLLOUT_KEYS}
        self.model.eval()  # dropout off; gradients flow as usual
        out = forward(self.model, batch, config.temperature, keep_logits=True)
        pg_loss, vf_loss, stats = self.loss(
            old["logprobs"],
            old["values"],
            out.logits,
            out.values,
            out.logprobs,
            mask,
            old["advantages"],
            old["returns"],
        )
        self._backward(pg_loss + vf_loss, sync)
        return stats

    def _backward(self, loss: Tensor, sync: bool) -> None:
        """Accumulate ``loss / gradient_accumulation_steps``; at ``sync``, clip and step.

        Accumulation is counted here rather than by `Accelerator.accumulate`, whose state is shared by every
        Accelerator of the process (two trainers with different settings would disturb each other); the factor
        cancels the division `accelerator.backward` applies with that shared setting.
        """
        if self.is_deepspeed:  # the engine accumulates, clips and steps itself (replayrl.ppo.sharding)
            return engine_backward(self.model, loss, self.config.gradient_accumulation_steps, sync)
        shared_steps = self.accelerator.gradient_accumulation_steps
        self.accelerator.backward(loss * shared_steps / self.config.gradient_accumulation_steps)
        if not sync:
            return
        if self.config.max_grad_norm is not None:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def _reduce_sum(self, value: Tensor) -> Tensor:
        """Sum over processes (identity on one process)."""
        return self.accelerator.reduce(value, reduction="sum") if self.is_distributed else value

    # ------------------------------------------------------------------------------------------ logging
    def log_stats(self, stats: dict, batch: dict, rewards, columns_to_log: tuple[str, ...] = ("query", "response")):
        """Send the step's scalar stats (+ env/reward_mean, env/reward_std) to the accelerate trackers and append
        them to ``metrics.jsonl`` in ``output_dir`` (else ``project_kwargs["project_dir"]``, if either is set).
        Call once per step, after `step`. (``batch`` and ``columns_to_log`` are accepted for TRL v0.7.1's
        signature; no table of samples is logged.)"""
        rewards = torch.stack([torch.as_tensor(r, dtype=torch.float32).reshape(()) for r in rewards])
        rewards = self.accelerator.gather(rewards.to(self.accelerator.device)).cpu()
        record = log_stats_record(stats, rewards)
        if self.config.log_with is not None:
            self.accelerator.log(record, step=self.current_step)
        if self.metrics_file is not None:
            self.metrics_file.write(self.current_step, record)
        return record

    @property
    def metrics_file(self) -> MetricsFile | None:
        """``metrics.jsonl`` in ``output_dir`` (else ``project_kwargs["project_dir"]``); None when neither is set."""
        directory = self.config.output_dir or self.config.project_kwargs.get("project_dir")
        return MetricsFile(Path(directory) / METRICS_FILE, self.accelerator.is_main_process) if directory else None

    # ------------------------------------------------------------------------------------------ managed loop
    def train(self, reward_funcs, **kwargs) -> dict:
        """Beyond TRL v0.7.1: generate -> reward functions -> step -> log, checkpointed; see `replayrl.ppo.loop`."""
        from replayrl.ppo.loop import train

        return train(self, reward_funcs, **kwargs)


def _flat_config(config: PPOConfig) -> dict:
    flat = {}
    for key, value in asdict(config).items():
        if isinstance(value, dict):
            flat.update({f"{key}/{k}": v for k, v in value.items()})
        elif value is None or isinstance(value, (int, float, str, bool)):
            flat[key] = value
    return flat


def _describe(value) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__}"
