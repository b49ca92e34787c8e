"""`SFTTrainer`: supervised fine-tuning on `transformers.Trainer`, with current TRL's API and TRL v0.7.1's names.

One step, as data flows:
  dataset -> format detected (`replayrl.data.formats`) -> tokenised, EOS once, masks, truncated
  (`replayrl.data.sft`) -> optionally packed best-fit-decreasing (`replayrl.data.packing`) -> collated with
  labels (-100 = no loss) and, for packed rows, a block-diagonal mask (`replayrl.data.collators`)
  -> logits -> per-token loss (`nll` or `dft`, `replayrl.algos.sft`) summed over the trained tokens and divided by
  the trained-token count of the whole accumulated batch (`num_items_in_batch`: every gradient-accumulation
  micro-batch and, with `average_tokens_across_devices`, every process), so the update does not depend on how the
  batch is split.
Metrics: loss, mean_token_accuracy, entropy (token-weighted over the logging window, no autograd), num_tokens
(input tokens seen so far, all processes).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from replayrl.accumulation import OwnLossScalingMixin
from replayrl.algos.logprobs import TokenStats
from replayrl.algos.sft import sft_token_loss, token_stats_sums, token_sum_loss
from replayrl.checkpoints import SafeCheckpointsMixin
from replayrl.data.chat_template import apply_chat_template_path
from replayrl.data.collators import IGNORE_INDEX, SFTDataCollator
from replayrl.data.formats import check_sft_format, convert_from_value_to_chatml, dataset_format
from replayrl.data.sft import (
    SFTTokenizeSettings,
    apply_formatting_func,
    check_chat_template,
    check_no_transform,
    prepare_sft_dataset,
    resolve_eos_token_id,
)
from replayrl.data.streaming import first_row, is_streaming, prepare_streaming_training
from replayrl.data.vision import text_processing_class, text_tokenizer
from replayrl.metrics.callback import attach_metrics_file
from replayrl.models.lm_head import forward_to_head
from replayrl.models.loading import (
    apply_peft,
    load_model,
    load_tokenizer,
    mirror_eos_token,
    model_id,
    set_special_token,
)
from replayrl.models.moe import RouterAuxLossMixin
from replayrl.models.prompt_learning import refuse_with_4d_layouts, virtual_positions
from replayrl.sft.config import SFTConfig
from replayrl.sft.vision import VISION_SFT_COLUMNS, check_vision_sft, is_vision_sft, vision_collator

logger = logging.getLogger(__name__)

# TRL v0.7.1's constructor arguments that are now SFTConfig fields: name -> config field.
SEED_CONFIG_KWARGS = {
    "dataset_text_field": "dataset_text_field",
    "packing": "packing",
    "max_seq_length": "max_length",
    "dataset_num_proc": "dataset_num_proc",
}
# TRL v0.7.1's arguments of its ConstantLengthDataset packing, which exact packing makes moot: accepted with a warning.
SEED_IGNORED_KWARGS = ("infinite", "num_of_sequences", "chars_per_token", "dataset_batch_size")


def _sft_config_from(args: TrainingArguments) -> SFTConfig:
    """An SFTConfig with `args`' TrainingArguments values (SFT's own fields at their defaults)."""
    values = args.to_dict()  # enums as their values; tokens are redacted there, so restored below
    values["hub_token"] = args.hub_token
    return SFTConfig(**{k: v for k, v in values.items() if k != "push_to_hub_token"})


class SFTTrainer(RouterAuxLossMixin, OwnLossScalingMixin, SafeCheckpointsMixin, Trainer):
    """TRL-compatible supervised fine-tuning trainer; see `SFTConfig` and `docs/sft.md`.

    `model`: a name/path (loaded with `args.model_init_kwargs`) or a model object. `train_dataset` /
    `eval_dataset`: language modeling (`text` / `messages`), prompt-completion (standard or conversational),
    or pre-tokenised (`input_ids`). TRL v0.7.1's `tokenizer=`, `dataset_text_field=`, `packing=`,
    `max_seq_length=` and `dataset_num_proc=` keywords are accepted and override `args`.
    """

    _tag_names = ["trl", "sft", "replayrl"]
    _name = "SFT"  # the method on the model card (replayrl.model_card.METHODS)

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: SFTConfig | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_loss_func=None,
        compute_metrics=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs=None,
        preprocess_logits_for_metrics=None,
        peft_config=None,
        formatting_func=None,
        tokenizer=None,
        **seed_kwargs: Any,
    ):
        args = self._resolve_args(args, model_id(model), seed_kwargs)
        prepare_streaming_training(args, train_dataset, "SFTTrainer")
        self._check_datasets(train_dataset, eval_dataset, args)
        self._check_padding_free(args, data_collator)
        self._check_loss_func(args, compute_loss_func)
        processing_class = self._resolve_tokenizer(processing_class, tokenizer, model, args)
        self._vision = is_vision_sft(train_dataset, eval_dataset)  # images: raw rows, collated by the processor
        if self._vision:
            check_vision_sft(args, model, processing_class, formatting_func)
        set_seed(args.seed)  # as TRL: a model or PEFT adapter built here is reproducible by the seed
        model = load_model(model, args.model_init_kwargs, trust_remote_code=args.trust_remote_code)
        if args.eos_token is not None:
            mirror_eos_token(model, processing_class, args.eos_token)
        model, processing_class, added_tokens = apply_chat_template_path(
            model, processing_class, args.chat_template_path
        )
        model = apply_peft(model, peft_config, added_tokens)
        packing = args.packing or bool(args.eval_packing)
        refuse_with_4d_layouts(model, "SFTTrainer", packing=packing, padding_free=args.padding_free)
        # a prompt-learning adapter's last virtual token predicts the first real token: its label is trained too
        self._first_label = 0 if virtual_positions(model) else 1
        self._init_router_aux(model, args.router_aux_loss_coef)
        self._eos_token_id = resolve_eos_token_id(text_tokenizer(processing_class), args.eos_token)
        self._formatting_func = formatting_func
        text_class = processing_class if self._vision else text_processing_class(processing_class)  # text rows
        train_dataset = self._prepare(train_dataset, text_class, args, formatting_func, args.packing)
        eval_dataset = self._prepare_eval(eval_dataset, text_class, args, formatting_func)
        if data_collator is None and self._vision:
            data_collator = vision_collator(model, processing_class, args)
        if data_collator is None:
            data_collator = self._default_collator(model, text_class, args)
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_loss_func=compute_loss_func,
            compute_metrics=compute_metrics,
            callbacks=callbacks,
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )
        self._sums: dict[str, Tensor] = {}  # mode -> (correct, entropy sum, trained tokens, input tokens)
        self._total_tokens = 0
        attach_metrics_file(self)

    # ----------------------------------------------------------------------------------------- set-up
    @staticmethod
    def _resolve_args(args: SFTConfig | None, name: str, seed_kwargs: dict) -> SFTConfig:
        unknown = sorted(set(seed_kwargs) - set(SEED_CONFIG_KWARGS) - set(SEED_IGNORED_KWARGS))
        if unknown:
            raise TypeError(f"SFTTrainer got unexpected keyword arguments {unknown}; SFT options go in SFTConfig.")
        ignored = sorted(k for k in seed_kwargs if k in SEED_IGNORED_KWARGS and seed_kwargs[k] is not None)
        if ignored:
            warnings.warn(
                f"SFTTrainer ignores TRL v0.7.1's ConstantLengthDataset arguments {ignored}: packing is exact "
                "(best-fit-decreasing, documents kept apart); see SFTConfig.packing / packing_strategy.",
                UserWarning,
                stacklevel=3,
            )
            seed_kwargs = {k: v for k, v in seed_kwargs.items() if k not in SEED_IGNORED_KWARGS}
        if args is None:
            args = SFTConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-SFT")
        elif isinstance(args, TrainingArguments) and not isinstance(args, SFTConfig):
            args = _sft_config_from(args)  # as TRL: plain TrainingArguments become an SFTConfig with SFT's defaults
        elif not isinstance(args, SFTConfig):
            raise ValueError(f"args must be an SFTConfig, got {type(args).__name__}; build one with SFTConfig(...).")
        for name, value in seed_kwargs.items():
            if value is not None:
                setattr(args, SEED_CONFIG_KWARGS[name], value)
        args._validate()
        return args

    @staticmethod
    def _resolve_tokenizer(processing_class, tokenizer, model, args: SFTConfig):
        if tokenizer is not None:
            if processing_class is not None and processing_class is not tokenizer:
                raise ValueError("Pass the tokenizer once: `processing_class=` (current) or `tokenizer=` (TRL v0.7.1).")
            processing_class = tokenizer
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        processing_class = load_tokenizer(processing_class, model, pad_with_eos=False, **remote)
        text = text_tokenizer(processing_class)  # a VLM's processor: its tokenizer
        if args.pad_token is not None:
            set_special_token(text, "pad_token", args.pad_token)
        if text.pad_token is None:
            text.pad_token = text.eos_token
        return processing_class

    @staticmethod
    def _check_loss_func(args: SFTConfig, compute_loss_func) -> None:
        """As TRL 1.16: `compute_loss_func` is deprecated (it needs the full logits) and cannot replace DFT's loss."""
        if compute_loss_func is None:
            return
        if args.loss_type == "dft":
            raise ValueError(
                "You passed a `compute_loss_func` together with `loss_type='dft'` to the `SFTTrainer`. When using "
                "`loss_type='dft'`, the loss function is internally set to the DFT loss, so passing a "
                "`compute_loss_func` is not allowed."
            )
        warnings.warn(
            "`compute_loss_func` is deprecated and will be removed in v2.0.0 (as in TRL 1.16). Subclass `SFTTrainer` "
            "and override `compute_loss` instead. Expect slower training meanwhile: the loss needs the full logits, "
            "which the fused LM head otherwise never forms.",
            FutureWarning,
            stacklevel=3,
        )

    @staticmethod
    def _check_padding_free(args: SFTConfig, data_collator) -> None:
        """TRL 1.16's padding-free checks: a custom collator would ignore `padding_free` (refused); one row per
        device batch has nothing to flatten, and 'wrapped' packing is not recommended with it (warnings)."""
        if not args.padding_free:
            return
        if data_collator is not None:
            raise ValueError(
                "Passing a custom data collator is not supported when using padding-free: it would batch the rows "
                "itself. Drop `data_collator`, or set `padding_free=False`."
            )
        if args.packing and args.packing_strategy == "wrapped":
            logger.warning(
                "You are passing `padding_free=True` with the 'wrapped' packing strategy, which is not recommended "
                "(as TRL 1.16 warns): 'wrapped' cuts documents at row ends; 'bfd' keeps them whole."
            )
        if args.per_device_train_batch_size == 1 and not args.packing:
            logger.warning(
                "You are using a per_device_train_batch_size of 1 with padding-free training: one row per batch has "
                "no padding to remove. Please consider increasing the batch size to at least 2."
            )

    @staticmethod
    def _check_datasets(train_dataset, eval_dataset, args: SFTConfig) -> None:
        """What TRL 1.16 refuses in dataset preparation, checked before the model is loaded."""
        if args.padding_free and not args.packing and args.max_length is not None:
            raise ValueError(
                "When `padding_free=True` without packing, `max_length` is not enforced (TRL 1.16 refuses this "
                "combination, and so does replayrl). Either enable packing (e.g., `packing=True, "
                "packing_strategy='bfd'`), or provide already truncated inputs and set `max_length=None` (got "
                f"max_length={args.max_length})."
            )
        if (args.dataset_kwargs or {}).get("skip_prepare_dataset"):
            return
        evals = list(eval_dataset.values()) if isinstance(eval_dataset, dict) else [eval_dataset]
        for dataset in [train_dataset, *evals]:
            check_no_transform(dataset)

    def _prepare(self, dataset, tokenizer, args: SFTConfig, formatting_func, packing: bool):
        """Format check, tokenisation, truncation and packing of one dataset (None passes through)."""
        if dataset is None or (args.dataset_kwargs or {}).get("skip_prepare_dataset") or self._vision:
            return dataset
        check_no_transform(dataset)
        streaming = is_streaming(dataset)
        if not streaming and (not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__")):
            raise ValueError(
                f"Expected a datasets.Dataset or datasets.IterableDataset, got {type(dataset).__name__}; build one "
                "with Dataset.from_list / load_dataset."
            )
        if first_row(dataset) is None:
            raise ValueError("The dataset is empty: SFT needs at least one row.")
        if streaming and packing:
            raise ValueError(
                "packing=True needs a map-style dataset (rows are packed over the whole dataset); a streaming "
                "(IterableDataset) one is trained unpacked: set packing=False, or load it without streaming=True."
            )
        if args.shuffle_dataset:  # TRL shuffles before packing (no correlated neighbours in a row) and after
            dataset = dataset.shuffle(seed=args.seed)
        if formatting_func is not None:
            dataset = apply_formatting_func(dataset, formatting_func, args.dataset_num_proc, args.dataset_text_field)
        dataset = convert_from_value_to_chatml(dataset, args.dataset_num_proc)
        fmt = dataset_format(dataset, args.dataset_text_field)
        check_sft_format(fmt, args.assistant_only_loss)
        check_chat_template(tokenizer, fmt, args.assistant_only_loss)
        settings = SFTTokenizeSettings(
            eos_token_id=self._eos_token_id,
            assistant_only_loss=args.assistant_only_loss,
            max_length=args.max_length,
            truncation_mode=args.truncation_mode,
        )
        dataset = prepare_sft_dataset(
            dataset,
            tokenizer,
            fmt,
            settings,
            completion_only_loss=args.completion_only_loss is not False,
            packing=packing,
            packing_strategy=args.packing_strategy,
            num_proc=args.dataset_num_proc,
        )
        return dataset.shuffle(seed=args.seed) if args.shuffle_dataset and packing else dataset

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """As Trainer.evaluate; a dataset passed here is prepared (formatted, tokenised, packed per eval_packing)
        like the constructor's eval_dataset (a str names one of those)."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            text_class = self.processing_class if self._vision else text_processing_class(self.processing_class)
            eval_dataset = self._prepare_eval(eval_dataset, text_class, self.args, self._formatting_func)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def _prepare_eval(self, eval_dataset, tokenizer, args: SFTConfig, formatting_func):
        packing = args.packing if args.eval_packing is None else args.eval_packing
        if isinstance(eval_dataset, dict):
            return {k: self._prepare(v, tokenizer, args, formatting_func, packing) for k, v in eval_dataset.items()}
        return self._prepare(eval_dataset, tokenizer, args, formatting_func, packing)

    @staticmethod
    def _default_collator(model, tokenizer, args: SFTConfig) -> SFTDataCollator:
        return SFTDataCollator(
            pad_token_id=tokenizer.pad_token_id,
            completion_only_loss=args.completion_only_loss is not False,
            assistant_only_loss=args.assistant_only_loss,
            padding_free=args.padding_free,
            attn_implementation=getattr(model.config, "_attn_implementation", None),
            pad_to_multiple_of=args.pad_to_multiple_of,
            prompt_predicts_first=virtual_positions(model) > 0,
        )

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None and self._vision:
            self._signature_columns = VISION_SFT_COLUMNS
        if self._signature_columns is None:
            self._signature_columns = ["input_ids", "labels", "completion_mask", "assistant_masks", "seq_lengths"]

    # ----------------------------------------------------------------------------------------- loss
    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> Tensor | None:
        """Trained tokens (labels != -100 after the causal shift; with prompt tuning / p-tuning, the first label too,
        predicted by the last virtual token) of all micro-batches of one optimizer step,
        summed over processes when `average_tokens_across_devices`."""
        if not batch_samples or "labels" not in batch_samples[0]:
            return None
        first = self._first_label
        count = sum((b["labels"][..., first:] != IGNORE_INDEX).sum() for b in batch_samples).to(device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            count = self.accelerator.gather(count).sum()
        return count

    def compute_loss(self, model, inputs: dict, return_outputs: bool = False, num_items_in_batch=None):
        """Token-sum loss over labels != -100 divided by `num_items_in_batch` (else this micro-batch's count).

        The lm_head is applied chunk by chunk to the trained positions only, together with the metrics
        (`replayrl.models.lm_head`): no full-vocabulary logits are formed. A user `compute_loss_func`, or
        `return_outputs=True` (eval with `compute_metrics`, `predict()`: deprecated, as TRL 1.16), gets the model's
        real logits instead."""
        mode = "train" if self.model.training else "eval"
        inputs = dict(inputs)
        token_count = inputs.pop("token_count", None)
        token_mask = inputs.pop("token_mask", None)  # (B, T) real tokens, for the MoE router loss
        labels = inputs.pop("labels")
        fused = self.compute_loss_func is None and not return_outputs
        if return_outputs:
            warnings.warn(
                "`return_outputs=True`, and the logits it passes to `compute_metrics` and "
                "`preprocess_logits_for_metrics`, are deprecated and will be removed in v2.0.0 (as in TRL 1.16). The "
                "fused LM head does not build the logits, so this forward builds them in full.",
                FutureWarning,
                stacklevel=2,
            )
        with self._router_capture():
            outputs, head = forward_to_head(model, fused, keep_prompt_end=True, **inputs, use_cache=False)
        targets = labels[:, 1 - head.lead :]  # head.lead = 1: the first label is predicted by the soft prompt
        mask = targets != IGNORE_INDEX
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.compute_loss_func is None):
            stats = head.positions(slice(None, -1)).token_stats(
                targets.clamp(min=0), mask=mask, with_entropy=True, with_predicted=True
            )
        if self.compute_loss_func is not None:  # the user's loss, given the same normaliser
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        else:
            per_token = sft_token_loss(stats.logps, self.args.loss_type)
            loss = token_sum_loss(per_token, mask, num_items_in_batch)
        if num_items_in_batch is not None:
            if self.args.average_tokens_across_devices and self.args.world_size > 1:
                loss = loss * self.accelerator.num_processes  # DDP averages gradients over processes
        elif mode == "train":
            loss = loss / self.current_gradient_accumulation_steps
        if self.aux_loss_enabled:
            loss = self._add_sft_router_aux(loss, mode, inputs, token_mask)
        self._record_metrics(mode, stats, targets, mask, token_count.sum() if token_count is not None else mask.numel())
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """As TRL 1.16: the outputs (full logits) are asked of `compute_loss` only when the logits are wanted
        (`compute_metrics`, `predict()`); a loss-only eval keeps the fused LM head."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            if prediction_loss_only:
                return self.compute_loss(model, inputs).detach(), None, None
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        return loss.detach(), outputs.logits, inputs.get("labels")

    def _add_sft_router_aux(self, loss: Tensor, mode: str, inputs: dict, token_mask: Tensor | None) -> Tensor:
        """The MoE router loss over the batch's real tokens (the collator's `token_mask` for multi-document rows,
        else a 2-D attention mask), divided by the micro-batches the step accumulates, as the SFT loss is."""
        if token_mask is None and inputs.get("attention_mask") is not None and inputs["attention_mask"].dim() == 2:
            token_mask = inputs["attention_mask"]
        steps = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        return self._add_router_aux(loss, mode, token_mask, steps if mode == "train" else 1)

    # ----------------------------------------------------------------------------------------- metrics
    def _extra_state(self) -> dict:
        """The running token count: `num_tokens` goes on from the checkpoint's value when a run resumes."""
        return {"total_tokens": self._total_tokens}

    def _load_extra_state(self, state: dict) -> None:
        self._total_tokens = int(state.get("total_tokens", 0))  # 0: a checkpoint from before it was saved

    def _record_metrics(self, mode: str, stats: TokenStats, targets: Tensor, mask: Tensor, token_count) -> None:
        """Add this micro-batch's (correct, entropy sum, trained tokens, input tokens) to the logging window.
        Kept on the device and reduced over processes once per log, not once per micro-batch."""
        correct, entropy, n = token_stats_sums(stats, targets, mask)
        local = torch.stack(
            [correct.float(), entropy, n.float(), torch.as_tensor(token_count, device=n.device).float()]
        )
        window = self._sums.get(mode)
        self._sums[mode] = local if window is None else window + local

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Every process calls this at the same points (Trainer logs on all ranks), so the reduction is safe."""
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        window = self._sums.pop(mode, None)
        local = window if window is not None else torch.zeros(4)
        correct, entropy, n, tokens = self.accelerator.reduce(
            local.to(self.accelerator.device), reduction="sum"
        ).tolist()
        if n > 0:  # in place: evaluate() returns them too
            logs[prefix + "mean_token_accuracy"] = correct / n
            logs[prefix + "entropy"] = entropy / n
        logs.update({prefix + k: v for k, v in self._router_aux_logs(mode, self.accelerator.device).items()})
        if mode == "train" and tokens > 0:  # not on the closing summary: it would count the last window twice
            self._total_tokens += int(tokens)
            logs["num_tokens"] = float(self._total_tokens)
        super().log(logs, start_time)
