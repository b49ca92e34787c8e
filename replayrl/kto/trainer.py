"""`KTOTrainer`: KTO (arXiv:2402.01306) from unpaired desirable / undesirable completions, as TRL 1.16's KTOTrainer.

What runs, per optimizer step:
  1. the step's micro-batches are fetched together (`get_batch_samples`); the reference point z0 = KL(pi || pi_ref)
     is estimated ONCE for the step from mismatched pairs of its rows (prompt i with the completion of its
     neighbour, `algos.kto.mismatched_partners`), under no_grad, summed over every process, clamped at 0;
  2. per micro-batch: completion log-probs of the policy and of the reference (a frozen copy, the base model with
     the adapter disabled under PEFT), computed chunk by chunk over the vocabulary (`models.lm_head`);
  3. loss = `algos.kto.kto_losses` (kto or apo_zero_unpaired, desirable/undesirable weights), each row's share of
     the mean over the step's rows, so 8 micro-batches of 1 row give the update of 1 micro-batch of 8.
Departures from TRL: docs/kto.md.
"""

from __future__ import annotations

import copy

import torch
from accelerate import PartialState
from torch import Tensor
from transformers import PreTrainedModel, Trainer, TrainerCallback, set_seed

from replayrl.accumulation import OwnLossScalingMixin
from replayrl.algos.kto import kto_loss_entry, kto_losses, kto_reference_point, mismatched_partners
from replayrl.checkpoints import SafeCheckpointsMixin
from replayrl.data.preference import truncate_pair
from replayrl.data.streaming import column_names, map_options, prepare_streaming_training
from replayrl.data.unpaired import (
    KTO_COLUMNS,
    UnpairedDataCollator,
    rename_old_kto_columns,
    rows_from_pairs,
    split_rows,
    tokenize_unpaired_row,
    unpair_rows,
    unpaired_kind,
)
from replayrl.kto.config import KTOConfig
from replayrl.metrics.callback import attach_metrics_file
from replayrl.metrics.means import MeanMetricsMixin
from replayrl.models.attention import is_peft_model
from replayrl.models.lm_head import forward_to_head
from replayrl.models.loading import apply_peft, disable_dropout, load_model, load_tokenizer, model_id
from replayrl.models.peft_reference import add_reference_adapter
from replayrl.models.reference import ReferenceModelMixin, check_ref_sync


class KTOTrainer(ReferenceModelMixin, OwnLossScalingMixin, SafeCheckpointsMixin, MeanMetricsMixin, Trainer):
    """TRL-compatible KTO trainer: `KTOTrainer(model, ref_model=None, args=KTOConfig(...), train_dataset=...)`."""

    _tag_names = ["trl", "kto", "replayrl"]
    _name = "KTO"  # the method on the model card (replayrl.model_card.METHODS)

    def __init__(
        self,
        model: str | PreTrainedModel,
        ref_model: str | PreTrainedModel | None = None,
        args: KTOConfig | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_metrics=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        quantization_config=None,
        peft_config=None,
    ):
        args = args if args is not None else KTOConfig(output_dir=f"{model_id(model).split('/')[-1]}-KTO")
        prepare_streaming_training(args, train_dataset, "KTOTrainer")
        if quantization_config is not None:
            raise ValueError("quantization_config is not supported by replayrl's KTO; pass None (load in full).")
        if ref_model is not None and ref_model is model and not isinstance(model, str):
            raise ValueError("ref_model is the same object as model; pass ref_model=None (a frozen copy is made).")
        self._check_batch(args)
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        set_seed(args.seed)  # as TRL: a model or PEFT adapter built here is reproducible by the seed
        model = load_model(model, args.model_init_kwargs, trust_remote_code=args.trust_remote_code)
        processing_class = load_tokenizer(processing_class, model, **remote)
        if peft_config is None and ref_model is None:  # TRL 1.16: a passed PeftModel's reference is its adapter
            add_reference_adapter(model)
        model = apply_peft(model, peft_config)
        ref_model = self._build_ref_model(model, ref_model, args)
        check_ref_sync(args, ref_model)
        with PartialState().main_process_first():
            train_dataset = self._tokenize(train_dataset, "train_dataset", processing_class, args)
            eval_dataset = self._tokenize(eval_dataset, "eval_dataset", processing_class, args)
        pad_id = processing_class.pad_token_id
        data_collator = data_collator or UnpairedDataCollator(pad_id, args.max_length, args.pad_to_multiple_of)
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
        self._pad_id = pad_id
        self._init_metrics()
        self._set_ref_model(ref_model)  # ReferenceModelMixin: prepared; TR-DPO's sync with sync_ref_model
        attach_metrics_file(self)

    # ----------------------------------------------------------------------------------------- setup
    @staticmethod
    def _check_batch(args: KTOConfig) -> None:
        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
        if kto_loss_entry(args.loss_type).reference_point and rows < 2:
            raise ValueError(
                f"per_device_train_batch_size * gradient_accumulation_steps = {rows}: KTO's KL estimate pairs each "
                "prompt with another row's completion, so each process needs at least 2 rows per optimizer step. "
                "Raise either."
            )

    @staticmethod
    def _build_ref_model(model, ref_model, args: KTOConfig):
        """The given reference, a frozen copy of the policy, or None under PEFT (adapter disabled); dropout off."""
        if ref_model is not None:
            ref_model = load_model(ref_model, args.model_init_kwargs if isinstance(ref_model, str) else None)
        elif not is_peft_model(model):
            ref_model = copy.deepcopy(model)
        for m in (model, ref_model):
            if m is not None and args.disable_dropout:
                disable_dropout(m)
        if ref_model is not None:
            ref_model.eval()
            ref_model.requires_grad_(False)
        return ref_model

    @staticmethod
    def _tokenize(dataset, name: str, tokenizer, args: KTOConfig):
        """TRL 1.16's prepared layout: the rows' columns (pairs unpaired into `prompt`, `completion`, `label`) plus
        `prompt_ids`, `completion_ids` and `label` (bool). A dataset that already has `prompt_ids`, `completion_ids`,
        `label` (or replayrl's earlier `prompt_input_ids`/`completion_input_ids`, renamed) is taken as tokenized;
        then rows whose prompt alone fills `max_length` are dropped (no completion token left to learn from)."""
        if dataset is None:
            return None
        if isinstance(dataset, dict):
            return {k: KTOTrainer._tokenize(v, f"{name}[{k!r}]", tokenizer, args) for k, v in dataset.items()}
        dataset = rename_old_kto_columns(dataset)
        kind = unpaired_kind(column_names(dataset), name)
        if kind == "paired":
            options = map_options(dataset, None, f"Unpairing {name}")
            dataset = dataset.map(unpair_rows, batched=True, remove_columns=column_names(dataset), **options)
        if kind != "tokenized":
            options = map_options(dataset, args.dataset_num_proc, f"Tokenizing {name}")
            dataset = dataset.map(tokenize_unpaired_row, fn_kwargs={"tokenizer": tokenizer}, **options)
        if args.max_length is not None:
            limit = args.max_length
            dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < limit)
        return dataset

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """As Trainer.evaluate; a dataset passed here is unpaired and tokenised like the constructor's."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            eval_dataset = self._tokenize(eval_dataset, "eval_dataset", self.processing_class, self.args)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def _set_signature_columns_if_needed(self):
        """The columns `remove_unused_columns=True` keeps: the collator's inputs (TRL 1.16's names), not the model's
        forward arguments."""
        if self._signature_columns is None:
            self._signature_columns = [*KTO_COLUMNS, "label"]

    # ----------------------------------------------------------------------------------------- KL estimate
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The step's micro-batches, each told the step's reference point and row count."""
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batches:
            rows = torch.tensor(float(sum(len(b["label"]) for b in batches)), device=self.accelerator.device)
            z0 = self._reference_point(batches)
            for batch in batches:
                batch["kto_reference_point"], batch["kto_step_rows"] = z0, rows
        return batches, num_items

    @torch.no_grad()
    def _reference_point(self, batches: list[dict]) -> Tensor:
        """z0 from mismatched pairs of all rows of `batches` (this process), averaged over every process."""
        device = self.accelerator.device
        if not kto_loss_entry(self.args.loss_type).reference_point:
            return torch.zeros((), device=device)
        pairs = [pair for batch in batches for pair in split_rows(batch)]
        if len(pairs) < 2:  # e.g. a last evaluation batch of one row: it adds nothing to the estimate
            pairs = []
        partners = mismatched_partners(len(pairs)).tolist() if pairs else []
        mismatched = [truncate_pair(pairs[i][0], pairs[j][1], self.args.max_length, "keep_start")
                      for i, j in enumerate(partners)]  # fmt: skip
        total = torch.zeros((), device=device)
        size = max(len(b["label"]) for b in batches)  # the memory of one micro-batch
        for start in range(0, len(mismatched), size):
            chunk = rows_from_pairs(mismatched[start : start + size], self._pad_id, self.args.pad_to_multiple_of)
            chunk = {k: v.to(device) for k, v in chunk.items()}
            with self._reference() as ref:
                ref_logps = completion_logps(ref, chunk)[0]
            total += (completion_logps(self.model, chunk)[0] - ref_logps).sum()
        stats = torch.stack([total, torch.tensor(float(len(pairs)), device=device)])
        stats = self.accelerator.reduce(stats, reduction="sum")
        return kto_reference_point(stats[0], stats[1])

    # ----------------------------------------------------------------------------------------- loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if model.training else "eval"
        logps, entropy = completion_logps(model, inputs, with_entropy=True)
        with torch.no_grad(), self._reference() as ref:
            ref_logps = completion_logps(ref, inputs)[0]
        if "kto_reference_point" not in inputs:  # evaluation: this batch's own estimate
            inputs["kto_reference_point"] = self._reference_point([inputs])
        z0 = inputs["kto_reference_point"]
        desirable = inputs["label"].bool()
        a = self.args
        losses = kto_losses(logps - ref_logps, desirable, z0, a.beta, a.desirable_weight, a.undesirable_weight,
                            a.loss_type)  # fmt: skip
        if model.training:  # this micro-batch's share of the mean over the step's rows
            loss = losses.sum() / inputs["kto_step_rows"]
        else:
            loss = losses.mean()
        self._record_metrics(mode, inputs, logps.detach() - ref_logps, logps.detach(), entropy, z0)
        return (loss, {}) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # ----------------------------------------------------------------------------------------- metrics
    def _record_metrics(self, mode: str, inputs: dict, logratios: Tensor, logps: Tensor, entropy, z0) -> None:
        """Global means (one all-reduce): rewards (beta * log-ratio) and log-probs of each side, token entropy."""
        good = inputs["label"].bool().float()
        tokens = inputs["completion_mask"][:, 1:].float()
        sums = torch.stack([
            (good * logratios).sum(), ((1 - good) * logratios).sum(), (good * logps).sum(), ((1 - good) * logps).sum(),
            good.sum(), (1 - good).sum(), (entropy * tokens).sum(), tokens.sum(),
        ]).float()  # fmt: skip
        s = self.accelerator.reduce(sums, reduction="sum").tolist()
        m = self._metrics[mode]
        if s[4] > 0:
            m["rewards/chosen"].append(self.args.beta * s[0] / s[4])
            m["logps/chosen"].append(s[2] / s[4])
        if s[5] > 0:
            m["rewards/rejected"].append(self.args.beta * s[1] / s[5])
            m["logps/rejected"].append(s[3] / s[5])
        if s[4] > 0 and s[5] > 0:
            m["rewards/margins"].append(m["rewards/chosen"][-1] - m["rewards/rejected"][-1])
        m["entropy"].append(s[6] / max(s[7], 1.0))
        m["kl"].append(float(z0))


def completion_logps(model, batch: dict[str, Tensor], with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Summed log-probs of each row's completion tokens ``(B,)`` and, with `with_entropy`, the per-position token
    entropies ``(B, L - 1)`` (no gradient). Rows: right-padded ``input_ids``, ``attention_mask``,
    ``completion_mask`` (B, L). The vocabulary is processed chunk by chunk (no full float32 logits)."""
    ids = batch["input_ids"]
    _, head = forward_to_head(model, input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False)
    mask = batch["completion_mask"][:, 1:].bool()
    stats = head.positions(slice(None, -1)).token_stats(ids[:, 1:], mask=mask, with_entropy=with_entropy)
    return stats.logps.sum(-1), stats.entropy
