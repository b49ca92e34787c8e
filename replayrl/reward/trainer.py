"""`RewardTrainer`: a scalar reward model trained on preference pairs (Bradley-Terry), on `transformers.Trainer`.

What runs, per batch of pairs: one forward of an `AutoModelForSequenceClassification` with `num_labels=1` on
each pair as one prefix-shared row (`replayrl.data.prefix_sharing`; else chosen and rejected rows concatenated);
the reward of a sequence is the head's value at its last non-pad token (transformers' pooling, which reads
`model.config.pad_token_id`, hence the check below); loss = -log sigmoid(r_c - r_r - margin)
[+ c * mean((r_c + r_r)^2)] (replayrl.algos.preference).
Metrics: loss, accuracy (r_c > r_r; ties count as wrong), margin, min/mean/max reward, num_tokens.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import torch
from accelerate import PartialState
from torch import Tensor, nn
from transformers import EvalPrediction, PreTrainedModel, Trainer, TrainerCallback, set_seed

from replayrl.accumulation import OwnLossScalingMixin, micro_batch_share
from replayrl.algos.preference import bradley_terry_loss, pairwise_accuracy
from replayrl.checkpoints import SafeCheckpointsMixin
from replayrl.data.chat_template import apply_chat_template_path
from replayrl.data.preference import (
    REWARD_COLUMNS,
    RewardDataCollatorWithPadding,
    dataset_kind,
    per_side_reward_batch,
    rename_old_reward_columns,
    tokenize_reward_row,
)
from replayrl.data.prefix_sharing import SIDES, SharedPrefixRows, share_prefixes_for
from replayrl.data.streaming import (
    column_names,
    drop_rows,
    map_options,
    prepare_streaming_training,
)
from replayrl.metrics.callback import attach_metrics_file
from replayrl.models.attention import attention_mask_for, base_model
from replayrl.models.loading import (
    apply_peft,
    disable_dropout,
    load_model,
    load_tokenizer,
    model_id,
    set_special_token,
)
from replayrl.models.prompt_learning import refuse_prompt_learning
from replayrl.reward.config import RewardConfig

logger = logging.getLogger(__name__)


def compute_accuracy(eval_pred: EvalPrediction) -> dict[str, float]:
    """TRL v0.7.1's API: predictions (N, 2) = [r_chosen, r_rejected] -> {"accuracy": fraction with r_c > r_r}.
    Ties count as wrong (TRL v0.7.1's argmax counted them as right; a constant model would score 1.0)."""
    predictions = np.asarray(eval_pred.predictions)
    return {"accuracy": float((predictions[:, 0] > predictions[:, 1]).mean())}


def _score_head(model) -> nn.Module | None:
    """The linear head of a decoder-only sequence classifier (`score`: Llama, Qwen, Mistral, Gemma, GPT-2, ...),
    None for other models (encoders attend both ways, so a shared prefix would see its completions)."""
    base = base_model(model)
    head = getattr(base, "score", None)
    return head if isinstance(head, nn.Module) and not base.config.is_encoder_decoder else None


def check_pad_token(model: PreTrainedModel, tokenizer) -> int:
    """The pad id the head pools with. Unset on the model config, the head cannot find the last real token (and
    accuracy sits at 0.5): take the tokenizer's, or raise."""
    if model.config.pad_token_id is None:
        if tokenizer is None or tokenizer.pad_token_id is None:
            raise ValueError(
                "model.config.pad_token_id is not set and the tokenizer has no pad token, so the reward head "
                "cannot find each sequence's last token. Set tokenizer.pad_token (e.g. to the EOS token) and "
                "model.config.pad_token_id = tokenizer.pad_token_id."
            )
        model.config.pad_token_id = tokenizer.pad_token_id
        logger.info("model.config.pad_token_id was unset; set it to the tokenizer's (%d).", tokenizer.pad_token_id)
    return model.config.pad_token_id


def apply_token_settings(model: PreTrainedModel, tokenizer, args: RewardConfig) -> list[int]:
    """TRL 1.16's tokenizer options: `eos_token` and `pad_token` become the tokenizer's (each must be one of its
    tokens) and the model config's ids; `chat_template_path` replaces its chat template (a file) or clones a
    tokenizer's (a folder: its tokens are added and the embeddings resized in place). Returns the added ids."""
    for name in ("eos_token", "pad_token"):
        token = getattr(args, name)
        if token is not None:
            set_special_token(tokenizer, name, token)
            setattr(model.config, f"{name}_id", getattr(tokenizer, f"{name}_id"))
    return apply_chat_template_path(model, tokenizer, args.chat_template_path)[2]


class RewardTrainer(OwnLossScalingMixin, SafeCheckpointsMixin, Trainer):
    """TRL-compatible reward trainer; also takes TRL v0.7.1's pre-tokenized columns (renamed to TRL 1.16's),
    `tokenizer=` and `max_length=`."""

    _tag_names = ["trl", "reward-trainer", "replayrl"]
    _name = "Reward"  # the method on the model card (replayrl.model_card.METHODS)

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: RewardConfig | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_metrics=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        preprocess_logits_for_metrics=None,
        peft_config=None,
        tokenizer=None,
        max_length: int | None = None,
    ):
        name = model_id(model)
        args = args if args is not None else RewardConfig(output_dir=f"{name.split('/')[-1]}-Reward")
        if max_length is not None:
            args.max_length = max_length
        prepare_streaming_training(args, train_dataset, "RewardTrainer")
        set_seed(args.seed)  # as TRL: a model or PEFT adapter built here is reproducible by the seed
        model = load_model(
            model, args.model_init_kwargs, architecture="reward", role="reward model",
            trust_remote_code=args.trust_remote_code,
        )  # fmt: skip
        if getattr(model.config, "num_labels", 1) != 1:
            n = model.config.num_labels
            raise ValueError(f"reward models require `num_labels=1` (got {n}): load the model with num_labels=1.")
        processing_class = processing_class or tokenizer
        if processing_class is None and name:
            remote = {"trust_remote_code": True} if args.trust_remote_code else {}
            processing_class = load_tokenizer(None, name, pad_with_eos=False, **remote)
        added_tokens = apply_token_settings(model, processing_class, args)
        pad_id = check_pad_token(model, processing_class)
        model = apply_peft(model, peft_config, added_tokens)
        refuse_prompt_learning(
            model,
            "RewardTrainer",
            "the score is read at each sequence's last real token, which the virtual tokens of prompt tuning and "
            "p-tuning move (transformers' pooling cannot find it from the embeddings PEFT passes), and PEFT's "
            "prefix tuning of a sequence classifier fails on transformers 5 models (it looks for past_key_values)",
        )
        if args.disable_dropout:
            disable_dropout(model)
        with PartialState().main_process_first():
            train_dataset = self._prepare(train_dataset, "train_dataset", processing_class, args)
            eval_dataset = self._prepare(eval_dataset, "eval_dataset", processing_class, args)
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator or RewardDataCollatorWithPadding(pad_id, args.pad_to_multiple_of),
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_metrics=compute_metrics or compute_accuracy,
            callbacks=callbacks,
            optimizers=optimizers,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )
        self.pad_token_id = pad_id
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._total_tokens = 0
        attach_metrics_file(self)

    def _set_signature_columns_if_needed(self):
        """The columns `remove_unused_columns=True` keeps (TRL 1.16's): the tokenised pair and the margin."""
        if self._signature_columns is None:
            self._signature_columns = [*REWARD_COLUMNS, "margin"]

    @staticmethod
    def _prepare(dataset, name: str, tokenizer, args: RewardConfig):
        """TRL 1.16's prepared layout: the rows' columns plus `chosen_ids`, `rejected_ids` (whole sequences; older
        pre-tokenized names renamed, TRL 1.16's pass through), then pairs longer than max_length dropped (as TRL:
        truncating would cut off what tells the pair apart)."""
        if dataset is None:
            return None
        if isinstance(dataset, dict):
            return {k: RewardTrainer._prepare(v, f"{name}[{k!r}]", tokenizer, args) for k, v in dataset.items()}
        dataset = rename_old_reward_columns(dataset, name)
        if dataset_kind(column_names(dataset), name, allow_pretokenized=True) == "preference":
            if tokenizer is None:
                raise ValueError(f"{name} holds text: pass processing_class (the tokenizer) to tokenise it.")
            dataset = dataset.map(
                tokenize_reward_row,
                fn_kwargs={"tokenizer": tokenizer, "append_eos": args.append_eos},
                **map_options(dataset, args.dataset_num_proc, f"Tokenizing {name}"),
            )
        if args.max_length is not None:
            dataset = RewardTrainer._drop_long_pairs(dataset, name, args.max_length)
        return dataset

    @staticmethod
    def _drop_long_pairs(dataset, name: str, limit: int):
        """Pairs longer than `limit` are dropped (a streaming dataset: lazily, without the count)."""

        def fits(x):
            return len(x["chosen_ids"]) <= limit and len(x["rejected_ids"]) <= limit

        return drop_rows(
            dataset,
            fits,
            f"Dropping {name} pairs longer than max_length",
            f"every pair of {name} is longer than max_length={limit}: raise max_length.",
            f"{name}: dropped %d of %d pairs longer than max_length={limit}",
        )

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """As Trainer.evaluate; a dataset passed here is tokenised like the constructor's."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):  # a str names one of eval_dataset's
            eval_dataset = self._prepare(eval_dataset, "eval_dataset", self.processing_class, self.args)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    # ----------------------------------------------------------------------------------------- loss
    def rewards(self, model, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """One forward on chosen and rejected together -> rewards (B,), (B,): one prefix-shared row per pair
        where it applies (`prefix_sharing`), else chosen and rejected rows concatenated. TRL 1.16's collator layout
        (`input_ids`, chosen rows then rejected) is taken too, split per side."""
        batch = per_side_reward_batch(batch)
        head = _score_head(model) if self.args.prefix_sharing else None
        rows = None if head is None else self._shared_rows(model, batch)
        if rows is not None:
            return self._shared_rewards(model, head, rows, batch)
        width = max(batch["input_ids_chosen"].shape[1], batch["input_ids_rejected"].shape[1])

        def both(key: str, fill: int) -> Tensor:
            parts = [batch[f"{key}_{side}"] for side in ("chosen", "rejected")]
            return torch.cat([nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts])

        ids, mask = both("input_ids", self.pad_token_id), both("attention_mask", 0)
        scores = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.squeeze(-1)
        n = batch["input_ids_chosen"].shape[0]
        return scores[:n], scores[n:]

    def _shared_rows(self, model, batch: dict[str, Tensor]) -> SharedPrefixRows | None:
        parts = (batch[f"{key}_{side}"] for side in SIDES for key in ("input_ids", "attention_mask"))
        return share_prefixes_for(model, *parts, self.pad_token_id, self.args.pad_to_multiple_of)

    def _shared_rewards(self, model, head: nn.Module, rows: SharedPrefixRows, batch) -> tuple[Tensor, Tensor]:
        """The head's outputs at every column of the shared rows (caught from inside the model's own forward, so
        DDP/FSDP see an ordinary forward), read where transformers' pooling would read each sequence: its last
        token that is not `config.pad_token_id`."""
        caught: list[Tensor] = []
        hook = head.register_forward_hook(lambda module, inputs, output: caught.append(output))
        try:
            mask = attention_mask_for(model, rows.attention_allowed())
            model(input_ids=rows.input_ids, attention_mask=mask, position_ids=rows.position_ids, use_cache=False)
        finally:
            hook.remove()
        scores, pad = caught[-1].squeeze(-1), base_model(model).config.pad_token_id  # (R, L)
        out = []
        for side in SIDES:
            ids = batch[f"input_ids_{side}"]
            last = (torch.arange(ids.shape[1], device=ids.device) * (ids != pad)).argmax(-1)  # as transformers
            last = torch.minimum(last, rows.lengths[side] - 1)  # a config pad id the collator does not pad with
            out.append(scores[rows.row_of_pair, rows.positions(side, last)])
        return out[0], out[1]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if model.training else "eval"
        inputs = per_side_reward_batch(inputs)  # TRL 1.16's collator layout too
        chosen, rejected = self.rewards(model, inputs)
        loss = bradley_terry_loss(chosen, rejected, inputs.get("margin"), self.args.center_rewards_coefficient)
        loss = micro_batch_share(self, loss, model.training)  # a mean over pairs: this micro-batch's share
        self._record_metrics(mode, inputs, chosen.detach(), rejected.detach())
        if return_outputs:
            return loss, {"rewards_chosen": chosen, "rewards_rejected": rejected}
        return loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, out = self.compute_loss(model, inputs, return_outputs=True)
        if prediction_loss_only:
            return loss.detach(), None, None
        logits = torch.stack([out["rewards_chosen"], out["rewards_rejected"]], dim=1)  # (B, 2)
        return loss.detach(), logits, torch.zeros(logits.shape[0], device=logits.device)

    # ----------------------------------------------------------------------------------------- metrics
    def _extra_state(self) -> dict:
        """The running token count: `num_tokens` goes on from the checkpoint's value when a run resumes."""
        return {"total_tokens": self._total_tokens}

    def _load_extra_state(self, state: dict) -> None:
        self._total_tokens = int(state.get("total_tokens", 0))  # 0: a checkpoint from before it was saved

    def _record_metrics(self, mode: str, batch: dict, chosen: Tensor, rejected: Tensor) -> None:
        gathered = self.accelerator.gather_for_metrics(torch.stack([chosen, rejected], dim=1).float())
        c, r = gathered[:, 0], gathered[:, 1]
        metrics = self._metrics[mode]
        metrics["accuracy"].append(pairwise_accuracy(c, r).item())
        metrics["margin"].append((c - r).mean().item())
        both = gathered.flatten()
        metrics["rewards/mean"].append(both.mean().item())
        metrics["rewards/min"].append(both.min().item())
        metrics["rewards/max"].append(both.max().item())
        if mode == "train":
            tokens = batch["attention_mask_chosen"].sum() + batch["attention_mask_rejected"].sum()
            self._total_tokens += int(self.accelerator.gather(tokens.reshape(1)).sum())
            metrics["num_tokens"] = [float(self._total_tokens)]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        values = {k: v for k, v in self._metrics[mode].items() if v}
        merged = {k: sum(v) / len(v) for k, v in values.items() if k not in ("rewards/min", "rewards/max")}
        if values.get("rewards/min"):
            merged["rewards/min"], merged["rewards/max"] = min(values["rewards/min"]), max(values["rewards/max"])
        # the batch-averaged accuracy must not overwrite compute_metrics' eval_accuracy over the whole set
        logs.update({prefix + k: v for k, v in merged.items() if prefix + k not in logs})
        self._metrics[mode].clear()
        super().log(logs, start_time)
