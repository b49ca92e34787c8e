"""`GRPOTrainer`: Group Relative Policy Optimization (arXiv:2402.03300) on `transformers.Trainer`.

What runs, per generation batch (each process generates `per_device_train_batch_size *
steps_per_generation` completions, whole groups of G):
  1. sample G completions per prompt with the generation backend (transformers `generate`, or vLLM with
     `use_vllm`: weights synced after each optimizer step, engine/trainer mismatch corrected, docs/vllm.md);
  2. score them with every reward function, weighted sum, None -> ignored;
  3. group-relative advantages (scale: group std, batch std or none);
  4. `_postprocess_rollout` hook (identity here; the replay trainer swaps zero-std groups);
  5. per micro-batch: clipped surrogate against the behaviour log-probs, + beta * k3 KL to a frozen
     reference, aggregated with token weights fixed once per batch (so the loss does not depend on how the
     batch is split into micro-batches or processes).

The trainer is glue: every formula is in `replayrl.algos`. Departures from TRL: docs/deviations.md.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import defaultdict
from typing import Any

import torch
from accelerate.utils import gather_object
from torch import Tensor
from transformers import AutoTokenizer, PreTrainedModel, Trainer, TrainerCallback

from replayrl import algos
from replayrl.checkpoints import SafeCheckpointsMixin
from replayrl.data.prompts import is_conversational, prompts_to_text, tokenize_prompts
from replayrl.generation import build_backend
from replayrl.generation.hf import build_generation_config
from replayrl.grpo.checks import check_datasets
from replayrl.grpo.config import GRPOConfig
from replayrl.grpo.generation import engine_correction, sync_generator
from replayrl.grpo.rollout import Rollout
from replayrl.grpo.sampler import RepeatSampler
from replayrl.metrics.callback import attach_metrics_file
from replayrl.models.loading import load_causal_lm
from replayrl.models.reference import SyncRefModelCallback
from replayrl.rewards.functions import RewardFunctions

logger = logging.getLogger(__name__)


def _identity_collator(features: list[dict]) -> list[dict]:
    return features


class GRPOTrainer(SafeCheckpointsMixin, Trainer):
    """TRL-compatible GRPO trainer. Arguments as TRL's `GRPOTrainer` (see the seed docs)."""

    _tag_names = ["trl", "grpo", "replayrl"]

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Any,
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        peft_config=None,
    ):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = self._default_config(f"{name.split('/')[-1]}-GRPO")
        model_id = model if isinstance(model, str) else model.config._name_or_path
        model = load_causal_lm(model, args.model_init_kwargs)
        if processing_class is None:
            processing_class = AutoTokenizer.from_pretrained(model_id, padding_side="left")
        if processing_class.pad_token is None:
            processing_class.pad_token = processing_class.eos_token
        if peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
        self.reward_funcs = RewardFunctions(reward_funcs, reward_processing_classes, args.reward_weights)
        check_datasets(args, train_dataset, eval_dataset, self.reward_funcs)
        self.ref_model = self._build_ref_model(model, args, peft_config is not None)

        super().__init__(
            model=model,
            args=args,
            data_collator=_identity_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        # compute_loss returns each micro-batch's share of the optimizer-step loss (see _finalize_rollout).
        self.loss_is_scaled_for_ga = True
        self.model_accepts_loss_kwargs = False
        self.num_generations = args.num_generations
        self.generate_every = args.steps_per_generation * args.num_iterations
        self.generation_config = build_generation_config(args, processing_class)
        self.generator = build_backend(
            args, self.accelerator.unwrap_model(self.model), processing_class, self.generation_config
        )
        self._synced_step: int | None = None  # optimizer step whose weights the generator has
        self._step = 0  # micro-batches served so far (drives when to generate)
        self._micro_batches: list[Rollout] | None = None
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._last_completions: dict[str, list] = {}
        self._total_tokens = 0
        self._generation_seconds = 0.0
        if self.ref_model is not None:
            self.ref_model = self.accelerator.prepare_model(self.ref_model, evaluation_mode=True)
        for reward_model in self.reward_funcs.models():
            reward_model.to(self.accelerator.device).eval()
        attach_metrics_file(self)
        if args.sync_ref_model:
            if self.ref_model is None:
                raise ValueError("sync_ref_model=True needs a reference model: set beta > 0 and do not use PEFT.")
            self.add_callback(SyncRefModelCallback(self))

    @staticmethod
    def _default_config(output_dir: str) -> GRPOConfig:
        return GRPOConfig(output_dir=output_dir)

    @staticmethod
    def _build_ref_model(model, args: GRPOConfig, is_peft: bool) -> PreTrainedModel | None:
        """No reference when beta == 0 (saves memory and a forward pass); PEFT uses the base model with the
        adapter disabled; otherwise a frozen copy of the initial policy."""
        if args.beta == 0.0 or is_peft:
            return None
        ref = copy.deepcopy(model)
        ref.eval()
        ref.requires_grad_(False)
        return ref

    # ----------------------------------------------------------------------------------------- data loading
    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["prompt"]

    def get_train_dataloader(self):
        # One dataloader batch = one process's whole generation batch (the sampler repeats it per micro-step).
        return self._get_dataloader(
            dataset=self.train_dataset,
            description="Training",
            batch_size=self._train_batch_size * self.args.steps_per_generation,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def _get_train_sampler(self, dataset=None):
        dataset = dataset if dataset is not None else self.train_dataset
        return RepeatSampler(
            dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.generate_every,
            shuffle=self.args.shuffle_dataset,
            seed=self.args.seed,
        )

    def _get_eval_sampler(self, eval_dataset):
        if self.args.per_device_eval_batch_size % self.num_generations != 0:
            raise ValueError(
                f"per_device_eval_batch_size ({self.args.per_device_eval_batch_size}) must be a multiple of "
                f"num_generations ({self.num_generations}) so that each process evaluates whole groups."
            )
        return RepeatSampler(eval_dataset, mini_repeat_count=self.num_generations, shuffle=False, seed=self.args.seed)

    # ----------------------------------------------------------------------------------------- rollouts
    def _prepare_inputs(self, inputs: list[dict]) -> Rollout:
        """Called once per micro-batch: generates every `generate_every` calls and serves slices."""
        if self._step % self.generate_every == 0 or self._micro_batches is None:
            start = time.perf_counter()
            rollout = self._generate_training_batch(inputs)
            rollout = self._postprocess_rollout(rollout)
            # each optimizer step's loss is full-scale whether a generation serves less or more than one step
            scale = self.args.steps_per_generation / self.args.gradient_accumulation_steps
            rollout = self._finalize_rollout(rollout, scale)
            self._micro_batches = rollout.split(self.args.steps_per_generation)
            self._generation_seconds += time.perf_counter() - start
        batch = self._micro_batches[self._step % self.args.steps_per_generation]
        self._step += 1
        return batch

    def _generate_training_batch(self, inputs: list[dict]) -> Rollout:
        """Generate and score a training batch; with `dynamic_sampling`, keep only groups with reward variance."""
        rollout = self._generate_and_score(inputs, mode="train")
        if self.args.dynamic_sampling:
            from replayrl.grpo.dynamic_sampling import fill_with_informative_groups

            rollout = fill_with_informative_groups(self, rollout, inputs)
        return rollout

    def _postprocess_rollout(self, rollout: Rollout) -> Rollout:
        """Hook between scoring and the loss (training only). The replay trainer swaps groups here."""
        return rollout

    def _generate_and_score(self, inputs: list[dict], mode: str) -> Rollout:
        device = self.accelerator.device
        prompts = [x["prompt"] for x in inputs]
        columns = {k: [x[k] for x in inputs] for k in inputs[0] if k != "prompt"}
        texts = prompts_to_text(self.processing_class, prompts)
        prompt_ids, prompt_mask = tokenize_prompts(self.processing_class, texts, self.args.max_prompt_length)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        start = time.perf_counter()
        sync_generator(self, self.accelerator.unwrap_model(self.model))
        out = self.generator.generate(prompt_ids, prompt_mask)
        completion_ids, completion_mask, truncated = out.completion_ids, out.completion_mask, out.truncated
        self._metrics[mode]["timing/generation"].append(time.perf_counter() - start)

        id_lists = [ids[m.bool()].tolist() for ids, m in zip(completion_ids, completion_mask)]
        texts_out = self.processing_class.batch_decode(id_lists, skip_special_tokens=True)
        completions = (
            [[{"role": "assistant", "content": t}] for t in texts_out] if is_conversational(prompts[0]) else texts_out
        )
        per_func = self.reward_funcs(prompts, completions, id_lists, columns, self.state, device)
        all_per_func = self.accelerator.gather(per_func)
        rewards, advantages, all_rewards = self._advantages(all_per_func, len(inputs))
        self._log_generation_metrics(mode, all_per_func, all_rewards, completion_mask, prompt_mask, truncated)
        if self.args.log_completions:
            self._last_completions = {"prompt": texts, "completion": texts_out, "reward": rewards.tolist()}

        n = len(inputs)
        rollout = Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            rewards=rewards,
            advantages=advantages,
            policy_version=torch.full((n,), self.state.global_step, dtype=torch.long, device=device),
            replayed=torch.zeros(n, dtype=torch.bool, device=device),
            truncated=truncated,
            engine_logps=out.logps,
        )
        return self._add_logps(rollout, mode)

    def _advantages(self, all_per_func: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """Rewards (n,) and advantages (n,) of this process's rows, and all processes' rewards, from every
        process's scores (world * n, F). Gathered so that 'batch' scaling and the logged figures use the global
        batch; groups never straddle processes, so 'group' scaling is the same either way."""
        all_rewards = self.reward_funcs.combine(all_per_func)
        if torch.isnan(all_rewards).all():
            raise ValueError(
                f"Every reward function ({self.reward_funcs.names}) returned None for every completion of the "
                "batch, so there is nothing to learn from. Check that the functions apply to this dataset."
            )
        if torch.isnan(all_rewards).any():
            logger.warning("Some completions were scored by no reward function (all None); they get zero advantage.")
        all_advantages = algos.group_advantages(all_rewards, self.num_generations, self.args.scale_rewards)
        local = slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n)
        return all_rewards[local], all_advantages[local], all_rewards

    @torch.no_grad()
    def _add_logps(self, rollout: Rollout, mode: str) -> Rollout:
        """Reference log-probs (beta > 0) and behaviour log-probs when the policy will have moved before the
        rows are trained on (num_iterations > 1, or one generation spans several optimizer steps). In the
        on-policy case the first loss pass supplies them for free."""
        start = time.perf_counter()
        changes = {}
        if self.args.beta != 0.0:
            changes["ref_logps"] = self._reference_logps(rollout)
        on_policy = (
            self.args.num_iterations == 1
            and self.args.gradient_accumulation_steps % self.args.steps_per_generation == 0
        )
        if mode == "train" and not on_policy:
            changes["old_logps"] = self._token_logps(self.model, rollout)[0]
        if changes:
            self._metrics[mode]["timing/logps"].append(time.perf_counter() - start)
        return rollout.with_(**changes)

    def _reference_logps(self, rollout: Rollout) -> Tensor:
        if self.ref_model is not None:
            return self._token_logps(self.ref_model, rollout)[0]
        with self.accelerator.unwrap_model(self.model).disable_adapter():  # PEFT: base model = reference
            return self._token_logps(self.model, rollout)[0]

    def _finalize_rollout(self, rollout: Rollout, scale: float = 1.0) -> Rollout:
        """Token weights for the loss, fixed once for the whole batch (see algos.token_weights), times
        `scale`. Slicing them per micro-batch keeps the loss independent of how the batch is split."""
        loss_mask = rollout.completion_mask.float()
        if self.args.mask_truncated_completions:
            loss_mask = loss_mask * (~rollout.truncated).unsqueeze(1)
        num_tokens = None
        if self.args.loss_type == "dapo":  # token mean over the global batch; DDP averages over processes
            total = self.accelerator.reduce(loss_mask.sum(), reduction="sum")
            num_tokens = float(total) / self.accelerator.num_processes
        weights = algos.token_weights(loss_mask, self.args.loss_type, self.args.max_completion_length, num_tokens)
        return rollout.with_(loss_weights=weights * scale)

    def _token_logps(self, model, rollout: Rollout, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Per-token log-probs (N, C) of the completion tokens (and entropies) at the sampling temperature.
        Only the completion positions' logits are computed (`logits_to_keep`)."""
        input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
        width = rollout.completion_ids.shape[1]
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1).logits
        logits = logits[:, :-1]  # logits at position t predict token t + 1
        return algos.token_logps_and_entropy(logits, rollout.completion_ids, self.args.temperature, with_entropy)

    # ----------------------------------------------------------------------------------------- loss
    def compute_loss(self, model, inputs: Rollout, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("GRPOTrainer does not return model outputs from compute_loss.")
        batch = inputs
        mode = "train" if model.training else "eval"
        logps, entropy = self._token_logps(model, batch, with_entropy=True)
        current = logps.detach()
        real = batch.completion_mask.bool()
        # Missing (NaN) behaviour log-probs are on-policy rows, whose behaviour policy is the current one.
        behaviour = _known_or(batch.old_logps, current, real)
        if mode == "train":
            batch.old_logps = behaviour  # keep them: the replay buffer stores behaviour log-probs
        old, is_weights = self._behaviour_correction(batch, current, behaviour)
        is_weights = engine_correction(self, mode, batch, behaviour, is_weights)
        per_token, low, high, _ = algos.clipped_surrogate(
            logps, old, batch.advantages, self.args.epsilon, self.args.epsilon_high, is_weights
        )
        kl = None
        if self.args.beta != 0.0:
            kl = algos.kl_k3(logps, _known_or(batch.ref_logps, current, real))
            per_token = per_token + self.args.beta * kl
        loss = (per_token * batch.loss_weights).sum()
        self._log_loss_metrics(mode, batch, logps, behaviour, entropy, kl, low, high)
        return loss

    def _behaviour_correction(self, batch: Rollout, current: Tensor, old: Tensor) -> tuple[Tensor, Tensor | None]:
        """Hook: the log-probs the ratio is taken against, and optional per-token importance weights.
        Plain GRPO: the behaviour log-probs, no weights."""
        return old, None

    # ----------------------------------------------------------------------------------------- eval
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with torch.no_grad():
            rollout = self._finalize_rollout(self._generate_and_score(inputs, mode="eval"))
            loss = self.compute_loss(model, rollout)
        return loss.detach(), None, None

    # ----------------------------------------------------------------------------------------- metrics
    def _reduce_means(self, mode: str, sums: dict[str, tuple[Tensor, Tensor]]) -> None:
        """Global means of several (sum, count) pairs with one all-reduce; skipped keys have count 0."""
        if not sums:
            return
        stacked = torch.stack([torch.stack([s.float(), c.float()]) for s, c in sums.values()])
        stacked = self.accelerator.reduce(stacked.to(self.accelerator.device), reduction="sum")
        for key, (total, count) in zip(sums, stacked.tolist()):
            if count > 0:
                self._metrics[mode][key].append(total / count)

    def _log_loss_metrics(self, mode, batch: Rollout, logps, behaviour, entropy, kl, low, high) -> None:
        mask = batch.loss_weights > 0
        n = mask.sum()
        region = low | high

        def masked(x: Tensor) -> tuple[Tensor, Tensor]:
            return x.detach().float()[mask].sum(), n

        sums = {"entropy": masked(entropy), "clip_ratio/low_mean": masked(low), "clip_ratio/high_mean": masked(high)}
        sums["clip_ratio/region_mean"] = masked(region)
        if kl is not None:
            sums["kl"] = masked(kl)
        sums.update(self._extra_loss_metrics(batch, logps, behaviour, mask))
        self._reduce_means(mode, sums)

    def _extra_loss_metrics(self, batch: Rollout, logps: Tensor, behaviour: Tensor, mask: Tensor) -> dict:
        """Hook: more (sum, count) metrics from the loss pass."""
        return {}

    def _log_generation_metrics(self, mode, all_per_func, all_rewards, completion_mask, prompt_mask, truncated):
        metrics = self._metrics[mode]
        lengths = self.accelerator.gather(completion_mask.sum(1)).float()
        tokens = self.accelerator.gather(completion_mask.sum() + prompt_mask.sum()).sum()
        all_truncated = self.accelerator.gather(truncated).float()
        if mode == "train":
            self._total_tokens += int(tokens)
            metrics["num_tokens"] = [float(self._total_tokens)]
        metrics["completion_length"].append(lengths.mean().item())
        metrics["completions/min_length"].append(lengths.min().item())
        metrics["completions/max_length"].append(lengths.max().item())
        metrics["completions/clipped_ratio"].append(all_truncated.mean().item())
        for i, name in enumerate(self.reward_funcs.names):
            column = all_per_func[:, i]
            column = column[~column.isnan()]
            if len(column):
                metrics[f"rewards/{name}/mean"].append(column.mean().item())
                metrics[f"rewards/{name}/std"].append(column.std().item() if len(column) > 1 else 0.0)
        metrics["reward"].append(all_rewards.nanmean().item())
        metrics["reward_std"].append(algos.group_std(all_rewards, self.num_generations).mean().item())
        zero = algos.zero_std_groups(all_rewards, self.num_generations)
        metrics["frac_reward_zero_std"].append(zero.float().mean().item())

    def training_step(self, model, inputs, num_items_in_batch=None):
        start, generation_before = time.perf_counter(), self._generation_seconds
        loss = super().training_step(model, inputs, num_items_in_batch)
        spent = time.perf_counter() - start - (self._generation_seconds - generation_before)
        self._metrics["train"]["timing/optimization"].append(spent)
        if (self._step - 1) % self.generate_every == self.args.steps_per_generation - 1:
            # first pass over the generation batch done: every row now carries behaviour log-probs
            self._after_first_pass(self._micro_batches)
        return loss

    def _after_first_pass(self, micro_batches: list[Rollout]) -> None:
        """Hook: called once per generation batch after its first loss pass (the replay trainer stores
        groups here). Not called during evaluation."""

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        metrics = {k: sum(v) / len(v) for k, v in self._metrics[mode].items() if v}
        if mode == "train" and "timing/optimization" in self._metrics["train"]:
            # per optimizer step, summed over its micro-batches
            steps = max(1, len(self._metrics["train"]["timing/optimization"]) // self.args.gradient_accumulation_steps)
            metrics["timing/optimization"] = sum(self._metrics["train"]["timing/optimization"]) / steps
        prefix = "eval_" if mode == "eval" else ""
        logs.update({prefix + k: v for k, v in metrics.items()})  # in place: evaluate() returns them too
        self._metrics[mode].clear()
        if self.args.log_completions and self._last_completions:
            self._print_completions()
        super().log(logs, start_time)

    def _print_completions(self) -> None:
        table = {k: gather_object(v) for k, v in self._last_completions.items()}
        self._last_completions = {}
        if not self.accelerator.is_main_process:
            return
        limit = self.args.num_completions_to_print or len(table["prompt"])
        print(f"\n{'prompt':<40} | {'completion':<40} | reward")
        for p, c, r in list(zip(table["prompt"], table["completion"], table["reward"]))[:limit]:
            print(f"{p[-40:]!r:<40} | {c[:40]!r:<40} | {r:.3f}")

    # ----------------------------------------------------------------------------------------- checkpoints
    def _extra_state(self) -> dict:
        """Trainer state that plain Trainer checkpoints lack. Subclasses extend it."""
        state = {"step": self._step, "total_tokens": self._total_tokens, "micro_batches": None, "ref_model": None}
        if self._micro_batches is not None and self._step % self.generate_every != 0:  # mid-generation cycle
            state["micro_batches"] = [mb.to("cpu").state_dict() for mb in self._micro_batches]
        if self.args.sync_ref_model:
            state["ref_model"] = self.accelerator.unwrap_model(self.ref_model).state_dict()
        return state

    def _load_extra_state(self, state: dict) -> None:
        self._step = state["step"]
        self._total_tokens = state["total_tokens"]
        if state["micro_batches"] is not None:
            device = self.accelerator.device
            self._micro_batches = [Rollout.from_state_dict(s).to(device) for s in state["micro_batches"]]
        if state["ref_model"] is not None:
            self.accelerator.unwrap_model(self.ref_model).load_state_dict(state["ref_model"])

    def _checkpoint_settings(self) -> dict:
        return {**super()._checkpoint_settings(), "num_generations": self.num_generations}


def _known_or(values: Tensor | None, current: Tensor, real: Tensor) -> Tensor:
    """`values` (N, C) where known and on a real token, else `current`. Padding positions (NaN, or values that
    are not log-probs) must never reach exp(): NaN * 0 is NaN, in the loss and in its gradient."""
    if values is None:
        return current
    return torch.where(real & ~values.isnan(), values, current)
