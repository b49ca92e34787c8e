"""`DPOTrainer`: Direct Preference Optimization (arXiv:2305.18290) and its variants on `transformers.Trainer`.

What runs, per batch of preference pairs:
  1. the collator builds prompt + chosen and prompt + rejected rows (labels = completion tokens only);
  2. ONE forward of the policy on chosen and rejected together: one prefix-shared row per pair by default
     (the prompt encoded once), else 2B rows (`replayrl.dpo.sequence_logps`), logits kept only from the first
     completion position on; sequence log-probs = sums of the completion tokens' log-probs;
  3. the same for the reference (no grad): a frozen copy of the initial policy, the base model with the adapter
     disabled under PEFT, nothing at all with `precompute_ref_log_probs` (log-probs computed once before
     training and stored as dataset columns) or `reference_free` (taken as 0);
  4. loss = sum_k w_k * loss_k over `loss_type` (pure functions in `replayrl.algos.preference`), optionally
     WPO-weighted and with RPO's NLL term; mean over the batch.
Metrics: rewards/chosen|rejected|accuracies|margins, logps/chosen|rejected, logits/chosen|rejected (docs/dpo.md).
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch
from accelerate import PartialState
from torch import Tensor, nn
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, Trainer, TrainerCallback, set_seed

from replayrl.accumulation import OwnLossScalingMixin, micro_batch_share
from replayrl.algos.preference import PairLogps, dpo_losses, implicit_rewards, wpo_weights
from replayrl.checkpoints import SafeCheckpointsMixin
from replayrl.data.preference import (
    DPO_COLUMNS,
    DPODataCollator,
    dataset_kind,
    drop_fully_truncated,
    per_side_dpo_batch,
    rename_old_dpo_columns,
    tokenize_dpo_row,
    truncate_dpo_row,
)
from replayrl.data.prefix_sharing import PADDING, PREFIX, SIDES, SharedPrefixRows, share_prefixes_for
from replayrl.data.streaming import column_names, is_streaming, map_options, prepare_streaming_training
from replayrl.data.vision import any_images, text_processing_class, text_tokenizer
from replayrl.data.vision_collator import vision_model_inputs
from replayrl.dpo.config import DPOConfig
from replayrl.dpo.sequence_logps import packed_sums, padded_sums, shared_sums
from replayrl.dpo.vision import VISION_DPO_COLUMNS, check_vision_dpo, vision_dpo_collator
from replayrl.metrics.callback import attach_metrics_file
from replayrl.models.attention import is_peft_model
from replayrl.models.loading import (
    apply_peft,
    disable_dropout,
    load_model,
    load_tokenizer,
    model_id,
    set_special_token,
)
from replayrl.models.moe import RouterAuxLossMixin
from replayrl.models.peft_reference import add_reference_adapter
from replayrl.models.prompt_learning import refuse_with_4d_layouts
from replayrl.models.reference import ReferenceModelMixin, check_ref_sync

SEED_ARGS = (
    "beta",
    "max_length",
    "max_prompt_length",
    "label_pad_token_id",
    "padding_value",
    "truncation_mode",
    "disable_dropout",
    "reference_free",
)


PRECOMPUTE_STREAMING = (
    "precompute_ref_log_probs=True is not supported with IterableDataset (streaming) datasets: it scores every row "
    "up front and stores the results by row. Set precompute_ref_log_probs=False (the reference model then scores "
    "each batch), or load the dataset without streaming=True."
)


def _any_streaming(dataset) -> bool:
    """Whether `dataset`, or any dataset of a dict of them (`IterableDatasetDict` included), is streaming."""
    parts = dataset.values() if isinstance(dataset, dict) else [dataset]
    return any(part is not None and is_streaming(part) for part in parts)


class DPOTrainer(ReferenceModelMixin, RouterAuxLossMixin, OwnLossScalingMixin, SafeCheckpointsMixin, Trainer):
    """TRL-compatible DPO trainer. Arguments as TRL's `DPOTrainer`; TRL v0.7.1's `beta`, `max_length`, ...
    may also be given here, and override `args`."""

    _tag_names = ["trl", "dpo", "replayrl"]
    _name = "DPO"  # the method on the model card (replayrl.model_card.METHODS)

    def __init__(
        self,
        model: str | PreTrainedModel,
        ref_model: str | PreTrainedModel | None = None,
        args: DPOConfig | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_metrics=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        peft_config=None,
        tokenizer=None,
        **seed_kwargs,
    ):
        if ref_model is not None and ref_model is model and not isinstance(model, str):  # one path: two loads
            raise ValueError(
                "ref_model is the same object as model: the reference must stay frozen while the policy trains. "
                "Pass ref_model=None (a frozen copy is made) or a separate model."
            )
        args = args if args is not None else DPOConfig(output_dir=f"{model_id(model).split('/')[-1]}-DPO")
        args = self._apply_seed_kwargs(args, seed_kwargs)
        prepare_streaming_training(args, train_dataset, "DPOTrainer")
        processing_class = self._load_tokenizer(processing_class or tokenizer, model, args)
        if args.precompute_ref_log_probs and (is_streaming(train_dataset) or _any_streaming(eval_dataset)):
            raise ValueError(PRECOMPUTE_STREAMING)
        set_seed(args.seed)  # as TRL: a model or PEFT adapter built here is reproducible by the seed
        model, ref_model = self._load_models(model, ref_model, args, peft_config)
        self._init_router_aux(model, args.router_aux_loss_coef)
        self._router_token_mask = None
        self.is_peft_model = is_peft_model(model)
        self._vision = any_images(train_dataset, eval_dataset)  # raw rows, collated by the processor
        if self._vision:
            check_vision_dpo(args, model, processing_class)
            data_collator = data_collator or vision_dpo_collator(model, processing_class, args)
        with PartialState().main_process_first():
            if not self._vision:
                text_class = text_processing_class(processing_class)  # a VLM's processor: its tokenizer
                train_dataset = self._tokenize(train_dataset, "train_dataset", text_class, args)
                eval_dataset = self._tokenize(eval_dataset, "eval_dataset", text_class, args)
        pad_id = args.padding_value if args.padding_value is not None else text_tokenizer(processing_class).pad_token_id
        if data_collator is None:
            data_collator = DPODataCollator(
                pad_id, args.label_pad_token_id, args.max_length, args.truncation_mode, args.pad_to_multiple_of
            )
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_metrics=compute_metrics,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._set_ref_model(ref_model)  # ReferenceModelMixin: prepared; TR-DPO's sync with sync_ref_model
        if args.precompute_ref_log_probs:
            self._precompute_all()
        attach_metrics_file(self)

    # ----------------------------------------------------------------------------------------- setup
    @staticmethod
    def _apply_seed_kwargs(args: DPOConfig, seed_kwargs: dict) -> DPOConfig:
        unknown = sorted(set(seed_kwargs) - set(SEED_ARGS))
        if unknown:
            raise TypeError(f"DPOTrainer got unexpected keyword arguments {unknown}; TRL v0.7.1's are {SEED_ARGS}")
        given = {k: v for k, v in seed_kwargs.items() if v is not None}
        if not given:
            return args
        args = copy.copy(args)
        for key, value in given.items():
            setattr(args, key, value)
        return args

    @staticmethod
    def _load_tokenizer(processing_class, model, args: DPOConfig):
        """The tokenizer (loaded with the model's name when not given), its pad token `args.pad_token` if set, else
        its own, else EOS (TRL's order)."""
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        processing_class = load_tokenizer(processing_class, model, pad_with_eos=args.pad_token is None, **remote)
        if args.pad_token is not None:
            set_special_token(text_tokenizer(processing_class), "pad_token", args.pad_token)
        return processing_class

    @staticmethod
    def _load_models(model, ref_model, args: DPOConfig, peft_config) -> tuple:
        """(policy, reference or None): loaded, PEFT-wrapped, dropout off."""
        model = load_model(model, args.model_init_kwargs, trust_remote_code=args.trust_remote_code)
        if peft_config is None and ref_model is None:  # TRL 1.16: a passed PeftModel's reference is its adapter
            add_reference_adapter(model)
        model = apply_peft(model, peft_config)
        refuse_with_4d_layouts(model, "DPOTrainer", padding_free=args.padding_free)
        ref_model = DPOTrainer._build_ref_model(model, ref_model, args)
        check_ref_sync(args, ref_model)
        if args.disable_dropout:
            for m in (model, ref_model):
                if m is not None:
                    disable_dropout(m)
        return model, ref_model

    @staticmethod
    def _build_ref_model(model, ref_model, args: DPOConfig):
        """The reference: None when reference-free, under PEFT (adapter disabled) and when precomputing without
        one (the untrained policy is the reference); else the given model or a frozen copy of the policy."""
        if args.reference_free:
            return None
        if ref_model is not None:
            ref_kwargs = args.ref_model_init_kwargs
            if isinstance(ref_model, str) and not {"dtype", "torch_dtype"} & set(ref_kwargs or {}):
                ref_kwargs = {**(ref_kwargs or {}), "dtype": model.dtype}  # like the policy, as TRL builds it
            ref_model = load_model(
                ref_model,
                ref_kwargs,
                role="ref_model",
                kwargs_name="ref_model_init_kwargs",
                trust_remote_code=args.trust_remote_code,
            )
        elif is_peft_model(model) or args.precompute_ref_log_probs:
            return None
        else:
            ref_model = copy.deepcopy(model)
        ref_model.eval()
        ref_model.requires_grad_(False)
        return ref_model

    @staticmethod
    def _tokenize(dataset, name: str, tokenizer, args: DPOConfig):
        """TRL 1.16's prepared layout: the rows' columns plus `prompt_ids`, `chosen_ids`, `rejected_ids`. A dataset
        that already has those (or TRL v0.7.1's `prompt_input_ids`/`chosen_input_ids`/`rejected_input_ids`, renamed)
        is taken as tokenized, cut to `max_prompt_length` / `max_completion_length` when set; then, under
        `keep_start`, pairs whose prompt fills `max_length` are dropped."""
        if dataset is None:
            return None
        if isinstance(dataset, dict):
            return {k: DPOTrainer._tokenize(v, f"{name}[{k!r}]", tokenizer, args) for k, v in dataset.items()}
        dataset = rename_old_dpo_columns(dataset)
        lengths = {"max_prompt_length": args.max_prompt_length, "max_completion_length": args.max_completion_length}
        options = map_options(dataset, args.dataset_num_proc, f"Tokenizing {name}")
        if dataset_kind(column_names(dataset), name) != "tokenized":
            dataset = dataset.map(tokenize_dpo_row, fn_kwargs={"tokenizer": tokenizer, **lengths}, **options)
        elif any(value is not None for value in lengths.values()):
            options = map_options(dataset, args.dataset_num_proc, f"Truncating {name}")
            dataset = dataset.map(truncate_dpo_row, fn_kwargs=lengths, **options)
        if args.max_length is not None and args.truncation_mode == "keep_start":
            dataset = drop_fully_truncated(dataset, name, args.max_length)
        return dataset

    def _set_signature_columns_if_needed(self):
        """The columns `remove_unused_columns=True` keeps (TRL 1.16's): the tokenised pair and precomputed reference
        log-probs."""
        if self._signature_columns is None:
            columns = VISION_DPO_COLUMNS if self._vision else [*DPO_COLUMNS, "ref_chosen_logps", "ref_rejected_logps"]
            self._signature_columns = columns

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """As Trainer.evaluate; a dataset passed here is tokenised (and gets reference log-probs when
        precomputing) like the constructor's."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            if self.args.precompute_ref_log_probs and _any_streaming(eval_dataset):
                raise ValueError(PRECOMPUTE_STREAMING)
            eval_dataset = self._tokenize(eval_dataset, "eval_dataset", text_processing_class(self.processing_class),
                                          self.args)  # fmt: skip
            if self.args.precompute_ref_log_probs and isinstance(eval_dataset, dict):
                eval_dataset = {k: self._with_ref_columns(v) for k, v in eval_dataset.items()}
            elif self.args.precompute_ref_log_probs:
                eval_dataset = self._with_ref_columns(eval_dataset)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    # ----------------------------------------------------------------------------------------- reference
    @torch.no_grad()
    def compute_ref_log_probs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Reference sequence log-probs (B,), (B,) of the batch's chosen and rejected completions."""
        with self._reference() as ref:
            out = self._forward(ref, batch, with_logits=False)
        return out["chosen_logps"], out["rejected_logps"]

    def _precompute_all(self) -> None:
        """Reference log-probs of every train/eval row, computed once, as columns `ref_chosen_logps` and
        `ref_rejected_logps`; then the reference model is released. Each process scores a shard;
        `gather_for_metrics` returns all rows in dataset order (dropping the padding duplicates)."""
        self.train_dataset = self._with_ref_columns(self.train_dataset)
        if isinstance(self.eval_dataset, dict):
            self.eval_dataset = {k: self._with_ref_columns(v) for k, v in self.eval_dataset.items()}
        elif self.eval_dataset is not None:
            self.eval_dataset = self._with_ref_columns(self.eval_dataset)
        # Never kept during training. Without a ref_model (and without PEFT) the reference was the untrained
        # policy, which stays valid only until the first update.
        self._released_reference = "ref_model" if self.ref_model is not None else "policy"
        self.ref_model = None

    def _with_ref_columns(self, dataset):
        if dataset is None or "ref_chosen_logps" in column_names(dataset):
            return dataset
        released = getattr(self, "_released_reference", None)
        if not self.is_peft_model and (released == "ref_model" or (released and self.state.global_step > 0)):
            raise ValueError(
                "Cannot compute reference log-probs for a dataset passed to evaluate(): precompute_ref_log_probs=True "
                "released the reference model after scoring the datasets given to the constructor. Pass it as "
                "eval_dataset to DPOTrainer, or add columns 'ref_chosen_logps'/'ref_rejected_logps' yourself."
            )
        batch_size = self.args.precompute_ref_batch_size or self.args.per_device_eval_batch_size
        loader = DataLoader(dataset, batch_size=batch_size, collate_fn=self.data_collator, shuffle=False)
        loader = self.accelerator.prepare(loader)
        chosen, rejected = [], []
        for batch in loader:
            c, r = self.compute_ref_log_probs(batch)
            c, r = self.accelerator.gather_for_metrics((c, r))
            chosen.append(c.float().cpu())
            rejected.append(r.float().cpu())
        dataset = dataset.add_column("ref_chosen_logps", torch.cat(chosen).tolist())
        return dataset.add_column("ref_rejected_logps", torch.cat(rejected).tolist())

    # ----------------------------------------------------------------------------------------- forward
    def concatenated_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """TRL v0.7.1's API: chosen rows then rejected rows, padded to one width: `concatenated_input_ids`,
        `concatenated_attention_mask`, `concatenated_labels`, each (2B, L)."""
        width = max(batch["chosen_input_ids"].shape[1], batch["rejected_input_ids"].shape[1])
        pad_id = self.data_collator.pad_token_id if hasattr(self.data_collator, "pad_token_id") else 0
        fills = {"input_ids": pad_id, "attention_mask": 0, "labels": self.args.label_pad_token_id}
        out = {}
        for key, fill in fills.items():
            parts = [batch[f"{side}_{key}"] for side in ("chosen", "rejected")]
            parts = [nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts]
            out[f"concatenated_{key}"] = torch.cat(parts, dim=0)
        return out

    def concatenated_forward(self, model, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """TRL v0.7.1's API: one forward on chosen + rejected. Returns (chosen_logps, rejected_logps, chosen_logits,
        rejected_logits), all (B,): summed completion log-probs and the mean logit over completion tokens
        (the full (B, T, V) logits are not returned, see docs/dpo.md)."""
        out = self._forward(model, batch)
        return out["chosen_logps"], out["rejected_logps"], out["chosen_logits"], out["rejected_logits"]

    def _forward(self, model, batch: dict[str, Tensor], with_logits: bool = True) -> dict[str, Tensor]:
        """One forward on the 2B concatenated rows -> chosen/rejected `logps` and `lengths` (B,) each, and with
        `with_logits` the mean completion logits and (use_weighting) WPO log-weights. TRL 1.16's collator layout
        (`input_ids`/`completion_mask`, chosen rows then rejected) is taken too, split per side."""
        pad, wpo, ld_alpha = self.args.label_pad_token_id, self.args.use_weighting, self.args.ld_alpha
        batch = per_side_dpo_batch(batch, pad)
        rows = self._shared_rows(model, batch)
        if rows is not None:
            sums = shared_sums(model, batch, rows, pad, with_logits, wpo, ld_alpha)
            # MoE router loss: real tokens, a shared prompt token twice (as in the two rows per pair of TRL's layout)
            self._router_token_mask = (rows.segments != PADDING).float() + (rows.segments == PREFIX).float()
        else:
            c = self.concatenated_inputs(batch)
            ids, mask, labels = c["concatenated_input_ids"], c["concatenated_attention_mask"], c["concatenated_labels"]
            layout = packed_sums if self.args.padding_free else padded_sums
            extra = {}
            if self._vision:  # the prompts' images, for every chosen row and then every rejected one
                collator = self.data_collator
                extra = vision_model_inputs(batch, ids, collator.image_token_ids, collator.token_keys)
            sums = layout(model, ids, mask, labels, pad, with_logits, wpo, ld_alpha, **extra)
            self._router_token_mask = None if self.args.padding_free else mask  # packed rows hold real tokens only
        n = batch["chosen_input_ids"].shape[0]
        out = {}
        for key, value in sums.items():
            out[f"chosen_{key}"], out[f"rejected_{key}"] = value[:n], value[n:]
        return out

    def _shared_rows(self, model, batch: dict[str, Tensor]) -> SharedPrefixRows | None:
        """The batch as prefix-shared rows, or None where that layout does not apply (see `prefix_sharing`)."""
        if not self.args.prefix_sharing or self.args.padding_free or self._vision:
            return None
        pad_id = getattr(self.data_collator, "pad_token_id", None) or 0
        parts = (batch[f"{side}_{key}"] for side in SIDES for key in ("input_ids", "attention_mask"))
        return share_prefixes_for(model, *parts, pad_id, self.args.pad_to_multiple_of)

    # ----------------------------------------------------------------------------------------- loss
    def dpo_loss(
        self,
        policy_chosen_logps: Tensor,
        policy_rejected_logps: Tensor,
        reference_chosen_logps: Tensor,
        reference_rejected_logps: Tensor,
        reference_free: bool | None = None,
        chosen_lengths: Tensor | None = None,
        rejected_lengths: Tensor | None = None,
        chosen_plain_logps: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """TRL v0.7.1's: (losses (B,), chosen_rewards (B,), rejected_rewards (B,)) under the configured loss_type(s).
        Log-probs (B,). `reference_free` None (the default) follows `DPOConfig.reference_free`; True takes the
        reference log-probs as 0. Without lengths, length-normalised losses (ipo, sigmoid_norm, sft) take the
        log-probs as given. `chosen_plain_logps`: the unweighted chosen log-probs where the others are LD-DPO
        weighted (`ld_alpha`), for the sft loss."""
        if reference_free is None:
            reference_free = self.args.reference_free
        if reference_free:
            reference_chosen_logps = torch.zeros_like(policy_chosen_logps)
            reference_rejected_logps = torch.zeros_like(policy_rejected_logps)
        ones = torch.ones_like(policy_chosen_logps)
        pairs = PairLogps(
            policy_chosen_logps,
            policy_rejected_logps,
            reference_chosen_logps,
            reference_rejected_logps,
            chosen_lengths if chosen_lengths is not None else ones,
            rejected_lengths if rejected_lengths is not None else ones,
            chosen_plain_logps,
        )
        losses, self._last_loss_parts = dpo_losses(
            self.args.loss_type, pairs, self.args.beta, self.args.loss_weights, **self._loss_options()
        )
        chosen_rewards, rejected_rewards = implicit_rewards(pairs, self.args.beta)
        return losses, chosen_rewards, rejected_rewards

    def _loss_options(self) -> dict:
        a = self.args
        return {
            "label_smoothing": a.label_smoothing,
            "f_divergence_type": a.f_divergence_type,
            "f_alpha_divergence_coef": a.f_alpha_divergence_coef,
            "discopop_tau": a.discopop_tau,
        }

    def get_batch_loss_metrics(self, model, batch: dict[str, Tensor], train_eval: str = "train"):
        """TRL v0.7.1's API: the batch's mean loss, and records its metrics under `train_eval`."""
        loss, _, _ = self._loss_and_rewards(model, batch, train_eval)
        return loss, {}

    def _loss_and_rewards(self, model, batch: dict[str, Tensor], mode: str) -> tuple[Tensor, Tensor, Tensor]:
        """(mean loss, chosen rewards (B,), rejected rewards (B,)) of the batch; records its metrics under `mode`."""
        with self._router_capture():
            out = self._forward(model, batch)
        router_mask = self._router_token_mask
        if "ref_chosen_logps" in batch:
            ref_c, ref_r = batch["ref_chosen_logps"], batch["ref_rejected_logps"]
        elif self.args.reference_free:
            ref_c, ref_r = torch.zeros_like(out["chosen_logps"]), torch.zeros_like(out["rejected_logps"])
        else:
            ref_c, ref_r = self.compute_ref_log_probs(batch)
        losses, chosen_rewards, rejected_rewards = self.dpo_loss(
            out["chosen_logps"],
            out["rejected_logps"],
            ref_c.to(out["chosen_logps"].dtype),
            ref_r.to(out["rejected_logps"].dtype),
            self.args.reference_free,
            out["chosen_lengths"],
            out["rejected_lengths"],
            out.get("chosen_plain_logps"),
        )
        if self.args.rpo_alpha is not None:  # RPO: NLL of the chosen completion, mean over its tokens
            chosen = out.get("chosen_plain_logps", out["chosen_logps"])
            losses = losses + self.args.rpo_alpha * (-chosen / out["chosen_lengths"].clamp(min=1))
        if self.args.use_weighting:
            losses = losses * wpo_weights(out["chosen_wpo"], out["rejected_wpo"])
        self._record_metrics(mode, out, chosen_rewards, rejected_rewards, losses)
        return self._add_router_aux(losses.mean(), mode, router_mask), chosen_rewards, rejected_rewards

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, metrics = self.get_batch_loss_metrics(model, inputs, "train" if model.training else "eval")
        loss = micro_batch_share(self, loss, model.training)  # a mean over pairs: this micro-batch's share
        return (loss, metrics) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """(loss, predictions, labels) of an eval batch. Predictions, when asked for (a `compute_metrics` is set):
        the implicit rewards (B, 2) = [chosen, rejected], beta * (log pi - log pi_ref) per pair; labels: zeros (B,),
        the preferred column. One row per pair, O(1) per pair whatever the vocabulary: TRL 1.16 returns the
        full-vocabulary logits (2B, T, V) and input ids here, which `evaluate()` would keep for the whole eval set
        (docs/deviations.md, "DPO compute_metrics")."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            if prediction_loss_only:  # through the TRL v0.7.1 hook, which a subclass may override
                return self.get_batch_loss_metrics(model, inputs, "eval")[0].detach(), None, None
            loss, chosen, rejected = self._loss_and_rewards(model, inputs, "eval")
        rewards = torch.stack([chosen, rejected], dim=1).detach().float()
        return loss.detach(), rewards, torch.zeros(rewards.shape[0], dtype=torch.long, device=rewards.device)

    # ----------------------------------------------------------------------------------------- metrics
    def _record_metrics(self, mode: str, out: dict, chosen_rewards, rejected_rewards, losses) -> None:
        values = {
            "rewards/chosen": chosen_rewards,
            "rewards/rejected": rejected_rewards,
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float(),
            "rewards/margins": chosen_rewards - rejected_rewards,
            "logps/chosen": out["chosen_logps"].detach(),
            "logps/rejected": out["rejected_logps"].detach(),
            "logits/chosen": out["chosen_logits"],
            "logits/rejected": out["rejected_logits"],
        }
        if len(self.args.loss_type) > 1:
            values.update({f"loss/{name}": part.detach() for name, part in self._last_loss_parts.items()})
        keys = list(values)
        stacked = torch.stack([values[k].float() for k in keys], dim=1)  # (B, K): one gather for all
        stacked = self.accelerator.gather_for_metrics(stacked)
        for key, column in zip(keys, stacked.mean(0).tolist()):
            self._metrics[mode][key].append(column)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        # batch means never overwrite what compute_metrics returned for the whole eval set under the same name
        means = {prefix + k: sum(v) / len(v) for k, v in self._metrics[mode].items() if v}
        logs.update({k: v for k, v in means.items() if k not in logs})
        logs.update({prefix + k: v for k, v in self._router_aux_logs(mode, self.accelerator.device).items()})
        self._metrics[mode].clear()
        super().log(logs, start_time)
