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
     batch is split into micro-batches or processes). The whole formula: `replayrl.grpo.objective`.

The trainer is glue: every formula is in `replayrl.algos`. Departures from TRL: docs/deviations.md.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, Trainer, TrainerCallback, set_seed

from replayrl import algos
from replayrl.accumulation import OwnLossScalingMixin
from replayrl.checkpoints import SafeCheckpointsMixin
from replayrl.data.prompts import is_conversational
from replayrl.data.vision import has_images, image_token_ids, text_tokenizer
from replayrl.generation import build_backend
from replayrl.generation.hf import build_generation_config
from replayrl.grpo import options
from replayrl.grpo.async_rollouts import WINDOW_MAX, AsyncGenerationMixin
from replayrl.grpo.checks import check_datasets, check_images, named_datasets
from replayrl.grpo.config import GRPOConfig
from replayrl.grpo.environments import EnvironmentMixin, build_environments, environment_dataset, environment_rewards
from replayrl.grpo.generation import engine_correction, generate_batch, prompt_images
from replayrl.grpo.objective import EntropyController, Inputs, grpo_objective
from replayrl.grpo.prompt_skipping import build_prompt_history, record_groups, skip_prompts
from replayrl.grpo.reporting import GRPOMetricsMixin
from replayrl.grpo.rollout import Rollout, known_or
from replayrl.grpo.rollout_func import run_rollout_func
from replayrl.grpo.sampler import PromptSamplingMixin
from replayrl.grpo.streaming import StreamingDataMixin
from replayrl.grpo.tools import ToolCallingMixin, accepts_completion_idx, tools_by_name
from replayrl.grpo.trl_methods import TRLMethodsMixin
from replayrl.metrics.callback import attach_metrics_file
from replayrl.metrics.trackers import log_completions_table
from replayrl.models.attention import is_peft_model
from replayrl.models.loading import apply_peft, disable_dropout, load_model, load_tokenizer, model_id
from replayrl.models.peft_reference import add_reference_adapter, reference_adapter
from replayrl.models.prompt_learning import refuse_prompt_learning
from replayrl.models.reference import SyncRefModelCallback
from replayrl.models.sharding import full_state_dict, load_full_state_dict, prepare_frozen_model, prepare_reward_models
from replayrl.rewards.functions import RewardFunctions

logger = logging.getLogger(__name__)


def _identity_collator(features: list[dict]) -> list[dict]:
    return features


class GRPOTrainer(
    PromptSamplingMixin,
    AsyncGenerationMixin,
    EnvironmentMixin,
    TRLMethodsMixin,
    ToolCallingMixin,
    StreamingDataMixin,
    GRPOMetricsMixin,
    OwnLossScalingMixin,
    SafeCheckpointsMixin,
    Trainer,
):
    """TRL-compatible GRPO trainer. Arguments as TRL 1.16's `GRPOTrainer` (docs/grpo.md)."""

    _tag_names = ["trl", "grpo", "replayrl"]
    _name = "GRPO"  # the method on the model card (replayrl.model_card.METHODS)
    # TRL 1.16 refuses train_dataset=None at construction (unless an environment owns the data)
    _train_dataset_optional = False
    # TRL 1.16 copies a passed PeftModel's adapter to a frozen "ref" adapter only when beta != 0 (RLOO: always)
    _ref_adapter_needs_beta = True

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        peft_config=None,
        tools: list | None = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
    ):
        if args is None:
            args = self._default_config(f"{model_id(model).split('/')[-1]}-GRPO")
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        set_seed(args.seed)  # as TRL: a model or PEFT adapter built here is reproducible by the seed
        model = load_model(model, args.model_init_kwargs, trust_remote_code=args.trust_remote_code)
        processing_class = load_tokenizer(processing_class, model, padding_side="left", **remote)
        if peft_config is None and (args.beta != 0.0 or not self._ref_adapter_needs_beta):
            add_reference_adapter(model)  # TRL 1.16: a passed PeftModel's reference is its adapter as given
        self._apply_model_options(model, args)  # after: the copy's dropout goes off too
        model = apply_peft(model, peft_config)
        if args.use_vllm or getattr(args, "use_transformers_continuous_batching", False):
            refuse_prompt_learning(
                model,
                f"{type(self).__name__} with use_vllm=True or use_transformers_continuous_batching=True",
                "those backends sample with the base weights (vLLM receives merged weights, into which a soft prompt "
                "or prefix cannot be merged; generate_batch bypasses PEFT's forward), not the trained policy",
                "Generate with transformers' generate() (both False)",
            )
        train_dataset = self._setup_rewards_and_tools(
            args, reward_funcs, reward_processing_classes, train_dataset, eval_dataset, processing_class,
            tools, rollout_func, environment_factory,
        )  # fmt: skip
        self.ref_model = self._build_ref_model(model, args, is_peft_model(model))

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
        # compute_loss returns each micro-batch's share of the optimizer-step loss (see _finalize_rollout), which
        # OwnLossScalingMixin back-propagates as is on every transformers version.
        self.num_generations = args.num_generations
        self.num_generations_eval = args.num_generations_eval or args.num_generations
        self._set_trl_attributes(args)
        self.aux_loss_enabled, self.router_aux_loss_coef = options.router_aux_loss_settings(
            model, args.router_aux_loss_coef
        )
        self.entropy_control = EntropyController.from_args(args)
        self._entropy_denominator: dict[str, float] = {}
        self.generate_every = args.steps_per_generation * args.num_iterations
        self._setup_generation(args, model, processing_class)
        self._setup_async_generation()  # async_generation: a worker samples ahead (grpo/async_rollouts.py)
        self.prompt_history = build_prompt_history(args, self.train_dataset)  # prompt_skipping, else None
        self._init_run_state()
        if self.ref_model is not None:
            self.ref_model = prepare_frozen_model(self.ref_model, self.accelerator)
        self._reward_engines = prepare_reward_models(self.reward_funcs.models(), self.accelerator)
        attach_metrics_file(self)
        if args.sync_ref_model:
            if self.ref_model is None:
                raise ValueError("sync_ref_model=True needs a reference model: set beta > 0 and do not use PEFT.")
            self.add_callback(SyncRefModelCallback(self))

    def _setup_rewards_and_tools(
        self, args, reward_funcs, reward_processing_classes, train_dataset, eval_dataset, processing_class, tools,
        rollout_func, environment_factory,
    ):  # fmt: skip
        """Reward functions, environments and tools (TRL's attributes), with the datasets checked against them
        before any engine starts. Returns the training dataset (an environment may build it)."""
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        reward_kwargs = {**(args.model_init_kwargs or {}), **remote}  # TRL: reward models given by name load with them
        self.rollout_func = rollout_func  # TRL's attribute (grpo/rollout_func.py)
        self._env = build_environments(rollout_func, environment_factory, tools)  # grpo/environments.py
        reward_funcs, reward_processing_classes, weights = environment_rewards(
            self._env, reward_funcs, reward_processing_classes, args.reward_weights
        )
        self.reward_funcs = RewardFunctions(reward_funcs, reward_processing_classes, weights, reward_kwargs)
        train_dataset = environment_dataset(self._env, train_dataset, args, self._train_dataset_optional)
        check_datasets(args, train_dataset, eval_dataset, self.reward_funcs, self._env is None, rollout_func is None)
        if has_images(train_dataset) or any(has_images(d) for _, d in named_datasets(eval_dataset)):
            check_images(args, processing_class, tools, environment_factory, rollout_func)  # before any engine starts
        self.tools, self._tools = list(tools or []), tools_by_name(tools)  # functions the model may call
        if self._env is not None:  # TRL: every environment's methods are tools too
            self.tools = self._env.all_tools
        # TRL's attribute: which tools take `_completion_idx` (told the index of the completion that called them)
        self._tools_accept_completion_idx = {t.__name__: accepts_completion_idx(t) for t in self.tools}
        self.reward_func_names = self.reward_funcs.names  # TRL's attributes
        self.reward_processing_classes = self.reward_funcs.processing_classes
        self.reward_weights = self.reward_funcs.weights
        return train_dataset

    def _init_run_state(self) -> None:
        """Per-run bookkeeping: what has been generated, served and logged so far."""
        self._synced_step: int | None = None  # optimizer step whose weights the generator has
        self._step = 0  # micro-batches served so far (drives when to generate)
        self._micro_batches: list[Rollout] | None = None
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._last_completions: dict[str, list] = {}
        self._total_tokens = 0
        self._generation_seconds = 0.0

    def _setup_generation(self, args: GRPOConfig, model, processing_class) -> None:
        """The generation config (TRL's `generation_kwargs` override the other options) and the backend."""
        self.generation_config = build_generation_config(args, text_tokenizer(processing_class))
        if image_token_ids(model.config):  # a VLM: completions must not contain image placeholders
            self.generation_config.suppress_tokens = image_token_ids(model.config)
        if args.generation_kwargs:
            self.generation_config.update(**args.generation_kwargs)
        self.generator = build_backend(
            args, self.accelerator.unwrap_model(self.model), processing_class, self.generation_config
        )

    @staticmethod
    def _default_config(output_dir: str) -> GRPOConfig:
        return GRPOConfig(output_dir=output_dir)

    @staticmethod
    def _apply_model_options(model, args: GRPOConfig) -> None:
        if args.disable_dropout:
            disable_dropout(model)
        if args.cast_lm_head_to_fp32:
            options.cast_lm_head_to_fp32(model)

    @staticmethod
    def _build_ref_model(model, args: GRPOConfig, is_peft: bool) -> PreTrainedModel | None:
        """No reference when beta == 0 (saves memory and a forward pass); PEFT uses the policy itself (see
        `_reference_logps`); otherwise a frozen copy of the initial policy."""
        if args.beta == 0.0 or is_peft:
            return None
        ref = copy.deepcopy(model)
        ref.eval()
        ref.requires_grad_(False)
        return ref

    # ----------------------------------------------------------------------------------------- data loading
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
        """Generate and score a training batch (`prompt_skipping`: replace skipped prompts; `dynamic_sampling`)."""
        if self.prompt_history is not None:  # GRESO (grpo/prompt_skipping.py)
            inputs = skip_prompts(self, inputs)
        rollout = self._generate_and_score(inputs, mode="train")
        if self.prompt_history is not None:
            record_groups(self, rollout.rewards)
        if self.args.dynamic_sampling:
            from replayrl.grpo.dynamic_sampling import fill_with_informative_groups

            rollout = fill_with_informative_groups(self, rollout, inputs)
        return rollout

    def _postprocess_rollout(self, rollout: Rollout) -> Rollout:
        """Hook between scoring and the loss (training only). The replay trainer swaps groups here."""
        return rollout

    def _generate_and_score(self, inputs: list[dict], mode: str) -> Rollout:
        device = self.accelerator.device
        prompts, columns = self._rollout_prompts(inputs)  # environments: reset, observations appended
        prompts, images = prompt_images(inputs, prompts, self._group_size(mode))  # images: data/vision.py
        texts = self._prompt_texts(prompts)
        if self.rollout_func is not None:  # the user's rollout replaces generation (grpo/rollout_func.py)
            gen = run_rollout_func(self, prompts, mode)
            columns.update(gen.extra)
        elif mode == "train" and self._async is not None:
            gen = self._async.take(inputs)
        else:
            special = not is_conversational(prompts[0])
            gen = generate_batch(self, texts, mode, add_special_tokens=special, images=images)
        prompt_ids, prompt_mask, truncated = gen.prompt_ids, gen.prompt_mask, gen.truncated
        completion_ids, completion_mask, messages = gen.completion_ids, gen.completion_mask, gen.messages

        id_lists = [ids[m.bool()].tolist() for ids, m in zip(completion_ids, completion_mask)]
        texts_out = self.processing_class.batch_decode(id_lists, skip_special_tokens=True)
        completions = texts_out
        if is_conversational(prompts[0]):  # with tools: the assistant and tool messages of every turn
            completions = messages or [[{"role": "assistant", "content": t}] for t in texts_out]
        per_func = self.reward_funcs(
            prompts, completions, id_lists, columns, self.state, device, **self._reward_logging_kwargs()
        )
        all_per_func = self.accelerator.gather(per_func)
        rewards, advantages, all_rewards = self._advantages(all_per_func, len(inputs), mode)
        self._log_generation_metrics(mode, all_per_func, all_rewards, completion_mask, prompt_mask, truncated)
        self._record_completions(mode, texts, texts_out, rewards, advantages, per_func, images)

        n = len(inputs)
        rollout = Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            rewards=rewards,
            advantages=advantages,
            policy_version=torch.full((n,), gen.version(self.state.global_step), dtype=torch.long, device=device),
            replayed=torch.zeros(n, dtype=torch.bool, device=device),
            truncated=truncated,
            tool_mask=gen.tool_mask,
            engine_logps=gen.engine_logps,
            vision=gen.vision,
        )
        return self._add_logps(rollout, mode)

    def _pad_to_multiple(self, ids: Tensor, mask: Tensor, side: str, pad_id: int | None = None):
        pad_id = self.generation_config.pad_token_id if pad_id is None else pad_id
        return options.pad_width_to_multiple(ids, mask, self.args.pad_to_multiple_of, side, pad_id)

    def _group_size(self, mode: str) -> int:
        return self.num_generations if mode == "train" else self.num_generations_eval

    def _advantages(self, all_per_func: Tensor, n: int, mode: str = "train") -> tuple[Tensor, Tensor, Tensor]:
        """Rewards (n,) and advantages (n,) of this process's rows, and all processes' rewards, from every
        process's scores (world * n, F). Gathered so that 'batch' scaling and the logged figures use the global
        batch; groups never straddle processes, so 'group' scaling is the same either way."""
        all_rewards = self.reward_funcs.combine(all_per_func)
        if self.args.on_unscored_batch == "raise" and torch.isnan(all_rewards).all():
            raise ValueError(
                f"Every reward function ({self.reward_funcs.names}) returned None for every completion of the "
                "batch, so there is nothing to learn from. Check that the functions apply to this dataset, or set "
                "on_unscored_batch='warn' to train on (TRL's behaviour)."
            )
        G = self._group_size(mode)
        if self.args.multi_objective_aggregation == "normalize_then_sum":
            weights = self.reward_funcs.weights
            all_advantages = algos.normalize_then_sum_advantages(all_per_func, weights, G)[1]
        else:
            all_advantages = algos.group_advantages(all_rewards, G, self.args.scale_rewards)
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
        if mode == "train" and self._async is not None:  # sampled by the worker's (older) weights: its log-probs
            changes["old_logps"] = rollout.engine_logps
        elif mode == "train" and not on_policy:
            changes["old_logps"] = self._token_logps(self.model, rollout)[0]
        if changes:
            self._metrics[mode]["timing/logps"].append(time.perf_counter() - start)
        return rollout.with_(**changes)

    def _reference_logps(self, rollout: Rollout) -> Tensor:
        if self.ref_model is not None:
            return self._token_logps(self.ref_model, rollout)[0]
        # PEFT: the frozen "ref" adapter of a passed PeftModel, else (peft_config) the base model
        with reference_adapter(self.accelerator.unwrap_model(self.model)):
            return self._token_logps(self.model, rollout)[0]

    def _finalize_rollout(self, rollout: Rollout, scale: float = 1.0) -> Rollout:
        """Token weights for the loss, fixed once for the whole batch (see algos.token_weights), times
        `scale`. Slicing them per micro-batch keeps the loss independent of how the batch is split."""
        loss_mask = rollout.completion_mask.float()
        if rollout.tool_mask is not None:  # tool results are not the model's actions
            loss_mask = loss_mask * rollout.tool_mask
        if self.args.mask_truncated_completions:
            loss_mask = loss_mask * (~rollout.truncated).unsqueeze(1)
        num_tokens = None
        if algos.grpo_loss(self.args.loss_type).aggregation.global_token_count or self.entropy_control.enabled:
            # token mean over the global batch; DDP averages over processes
            total = self.accelerator.reduce(loss_mask.sum(), reduction="sum")
            num_tokens = float(total) / self.accelerator.num_processes
            mode = "train" if self.model.training else "eval"
            self._entropy_denominator[mode] = max(num_tokens, 1.0) / scale
        weights = algos.token_weights(loss_mask, self.args.loss_type, self.args.max_completion_length, num_tokens)
        return rollout.with_(loss_weights=weights * scale)

    def _token_logps(self, model, rollout: Rollout, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Per-token log-probs (N, C) of the completion tokens (and entropies) at the sampling temperature.
        Only the completion positions are computed (`logits_to_keep`), the lm_head chunk by chunk
        (`replayrl.models.lm_head`): no full-vocabulary logits are formed."""
        logps, entropy, _ = self._policy_forward(model, rollout, with_entropy)
        return logps, entropy

    def _policy_forward(self, model, rollout: Rollout, with_entropy: bool = False, entropy_grad: bool = False):
        """(log-probs (N, C), entropies (N, C) or None, MoE router aux loss or None) of one forward pass."""
        input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
        width = rollout.completion_ids.shape[1]
        vision = getattr(rollout, "vision", None)  # a VLM's image inputs (any record with the token fields works)
        extra = {} if vision is None else vision.model_kwargs(rollout.prompt_mask, width)
        return self._forward_token_stats(model, input_ids, attention_mask, width, with_entropy, entropy_grad, **extra)

    # ----------------------------------------------------------------------------------------- loss
    def compute_loss(self, model, inputs: Rollout, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("GRPOTrainer does not return model outputs from compute_loss.")
        batch = inputs
        mode = "train" if model.training else "eval"
        bonus = self.entropy_control.enabled and torch.is_grad_enabled()
        logps, entropy, aux = self._policy_forward(model, batch, with_entropy=True, entropy_grad=bonus)
        current = logps.detach()
        real = batch.completion_mask.bool()
        # Missing (NaN) behaviour log-probs are on-policy rows, whose behaviour policy is the current one.
        behaviour = known_or(batch.old_logps, current, real)
        if mode == "train":
            batch.old_logps = behaviour  # keep them: the replay buffer stores behaviour log-probs
        old, is_weights = self._behaviour_correction(batch, current, behaviour)
        is_weights = engine_correction(self, mode, batch, behaviour, is_weights)
        x = Inputs(batch, logps, old, behaviour, is_weights=is_weights, entropy=entropy)
        if self.args.beta != 0.0:
            x.ref = known_or(batch.ref_logps, current, real)
        self._add_token_masks(x, batch.loss_weights > 0)  # get_high_entropy_mask / get_off_policy_mask
        if self.entropy_control.enabled:
            x.entropy_coef = self.entropy_control.applied()
            x.entropy_weights = 1.0 / self._entropy_denominator[mode]
        objective = self._objective(x)
        loss = objective.loss
        if self.aux_loss_enabled and aux is not None:
            steps = self.args.gradient_accumulation_steps if mode == "train" else 1
            loss = loss + self.router_aux_loss_coef * aux / steps
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux.detach().reshape(1)).mean().item())
        self._update_entropy_control(mode, entropy, objective)
        self._log_loss_metrics(mode, batch, logps, behaviour, entropy, objective)
        return loss

    def _objective(self, x: Inputs):
        """Hook: the micro-batch objective (`grpo.objective.Objective`). GRPO: the config's loss_type."""
        return grpo_objective(self.args, x)

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
        metrics = {k: max(v) if k in WINDOW_MAX else sum(v) / len(v) for k, v in self._metrics[mode].items() if v}
        if mode == "train" and "timing/optimization" in self._metrics["train"]:
            # per optimizer step, summed over its micro-batches
            steps = max(1, len(self._metrics["train"]["timing/optimization"]) // self.args.gradient_accumulation_steps)
            metrics["timing/optimization"] = sum(self._metrics["train"]["timing/optimization"]) / steps
        prefix = "eval_" if mode == "eval" else ""
        logs.update({prefix + k: v for k, v in metrics.items()})  # in place: evaluate() returns them too
        self._metrics[mode].clear()
        table = self._print_completions() if self.args.log_completions and self._last_completions else None
        super().log(logs, start_time)
        if table:  # after the metrics, as TRL: the trackers of report_to get the table (main process)
            log_completions_table(self, table)

    # ----------------------------------------------------------------------------------------- checkpoints
    def _extra_state(self) -> dict:
        """Trainer state that plain Trainer checkpoints lack. Subclasses extend it."""
        state = {"step": self._step, "total_tokens": self._total_tokens, "micro_batches": None, "ref_model": None}
        state["completions_generated"] = getattr(self, "_completions_generated", 0)  # the model card's figure
        state["entropy_control"] = self.entropy_control.state_dict()  # adaptive entropy coefficient
        if self._micro_batches is not None and self._step % self.generate_every != 0:  # mid-generation cycle
            state["micro_batches"] = [mb.to("cpu").state_dict() for mb in self._micro_batches]
        if self.args.sync_ref_model:
            state["ref_model"] = full_state_dict(self.accelerator.unwrap_model(self.ref_model))
        state["async"] = None if self._async is None else self._async.state_dict()  # in-flight batches: saved
        state["prompt_skipping"] = None if self.prompt_history is None else self.prompt_history.state_dict()
        return state

    def _load_extra_state(self, state: dict) -> None:
        self._step = state["step"]
        self._total_tokens = state["total_tokens"]
        self._completions_generated = state.get("completions_generated", 0)
        if state.get("entropy_control") is not None:
            self.entropy_control.load_state_dict(state["entropy_control"])
        if state["micro_batches"] is not None:
            device = self.accelerator.device
            self._micro_batches = [Rollout.from_state_dict(s).to(device) for s in state["micro_batches"]]
        if state["ref_model"] is not None:
            load_full_state_dict(self.accelerator.unwrap_model(self.ref_model), state["ref_model"])
        if state.get("async") is not None and self._async is not None:
            self._async.load_state_dict(state["async"])
        if state.get("prompt_skipping") is not None and self.prompt_history is not None:
            self.prompt_history.load_state_dict(state["prompt_skipping"])

    def _checkpoint_settings(self) -> dict:
        return {**super()._checkpoint_settings(), "num_generations": self.num_generations}
