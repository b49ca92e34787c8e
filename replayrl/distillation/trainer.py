"""`DistillationTrainer`: on-policy distillation (GKD, arXiv:2306.13649) as TRL 1.16's DistillationTrainer.

What runs, per optimizer step:
  1. the step's micro-batches of prompts are fetched together (`get_batch_samples`) and the student samples one
     completion per prompt for all of them in one call of the generation backend (transformers `generate`, or vLLM
     colocate / server with `use_vllm=True`, the weights synced once per optimizer step);
  2. per micro-batch: the student (with gradient) and the teacher (no gradient) score prompt + completion; at each
     completion position the generalised JSD between their next-token distributions (`beta`: 0 forward KL,
     1 reverse KL) is computed chunk by chunk from the hidden states and each model's lm_head
     (`algos.distillation.chunked_generalized_jsd`: no full-vocabulary logits of either model are held; the
     gradient w.r.t. the student's logits is formed in closed form chunk by chunk, nothing is recomputed);
  3. loss = sum of the per-token divergences / the completion tokens of the step (all micro-batches and
     processes), so 8 micro-batches of 1 prompt give the update of 1 micro-batch of 8.
Departures from TRL: docs/distillation.md.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel, Trainer, TrainerCallback, set_seed

from replayrl.accumulation import OwnLossScalingMixin
from replayrl.algos.distillation import chunked_generalized_jsd
from replayrl.algos.logprobs import default_chunk_size
from replayrl.checkpoints import SafeCheckpointsMixin
from replayrl.data.prompts import is_conversational, prompts_to_text, tokenize_prompts
from replayrl.distillation.config import DistillationConfig
from replayrl.generation import build_backend
from replayrl.generation.hf import build_generation_config
from replayrl.metrics.callback import attach_metrics_file
from replayrl.metrics.means import MeanMetricsMixin
from replayrl.metrics.trackers import log_completions_table
from replayrl.models.lm_head import forward_to_head
from replayrl.models.loading import apply_peft, disable_dropout, load_model, load_tokenizer, model_id
from replayrl.models.prompt_learning import refuse_prompt_learning
from replayrl.models.sharding import gathered_parameters, generation_context, prepare_frozen_model


def _identity_collator(features: list[dict]) -> list[dict]:
    return features


class DistillationTrainer(OwnLossScalingMixin, SafeCheckpointsMixin, MeanMetricsMixin, Trainer):
    """TRL-compatible on-policy distillation: `DistillationTrainer(model, teacher_model, args, train_dataset, ...)`;
    the dataset needs a `prompt` column (text or conversation)."""

    _tag_names = ["trl", "distillation", "replayrl"]
    _name = "Distillation"  # the method on the model card (replayrl.model_card.METHODS)

    def __init__(
        self,
        model: str | PreTrainedModel,
        teacher_model: str | PreTrainedModel | None = None,
        args: DistillationConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        quantization_config=None,
        peft_config=None,
        tools: list | None = None,
    ):
        name = model_id(model).split("/")[-1]
        args = args if args is not None else DistillationConfig(output_dir=f"{name}-Distillation")
        if quantization_config is not None or tools:
            raise ValueError("quantization_config and tools are not supported by replayrl's distillation; pass None.")
        for name, data in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            if data is not None and "prompt" not in data.column_names:
                raise ValueError(f"{name} has no 'prompt' column (columns: {data.column_names}); rename_column it.")
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        set_seed(args.seed)  # as TRL: a model or PEFT adapter built here is reproducible by the seed
        model = load_model(model, args.model_init_kwargs, trust_remote_code=args.trust_remote_code)
        processing_class = load_tokenizer(processing_class, model, **remote)
        model = apply_peft(model, peft_config)
        refuse_prompt_learning(  # as TRL 1.16's DistillationTrainer
            model,
            "DistillationTrainer",
            "its on-policy completions are sampled by a generation backend that is not given the soft prompt or "
            "prefix, and the student and teacher distributions are compared position by position",
        )
        if args.disable_dropout:
            disable_dropout(model)
        teacher = self._load_teacher(teacher_model, args, model, remote)
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
        self.teacher_model = prepare_frozen_model(teacher, self.accelerator)
        self.generation_config = build_generation_config(args, processing_class)
        if args.generation_kwargs:
            self.generation_config.update(**args.generation_kwargs)
        unwrapped = self.accelerator.unwrap_model(self.model)
        self.generator = build_backend(args, unwrapped, processing_class, self.generation_config)
        self._synced_step: int | None = None  # optimizer step whose weights the generator has
        self._chunk = default_chunk_size(unwrapped.config.get_text_config().vocab_size, device=self.accelerator.device)
        self._last_completions: list[tuple[str, str]] = []
        self._init_metrics()
        attach_metrics_file(self)

    @staticmethod
    def _load_teacher(teacher_model, args: DistillationConfig, student, remote: dict) -> PreTrainedModel:
        teacher_model = teacher_model if teacher_model is not None else args.teacher_model_name_or_path
        if teacher_model is None:
            raise ValueError("No teacher: pass teacher_model= or set DistillationConfig.teacher_model_name_or_path.")
        if not isinstance(teacher_model, str) and args.teacher_model_init_kwargs is not None:
            raise ValueError("teacher_model_init_kwargs only applies to a teacher given by name; set it to None.")
        kwargs = {**(args.teacher_model_init_kwargs or {}), **remote} if isinstance(teacher_model, str) else None
        teacher = load_model(teacher_model, kwargs, role="teacher_model", kwargs_name="teacher_model_init_kwargs")
        v_student = student.config.get_text_config().vocab_size
        v_teacher = teacher.config.get_text_config().vocab_size
        if v_student != v_teacher:
            raise ValueError(
                f"The student's vocab_size is {v_student} and the teacher's {v_teacher}: the divergence compares full "
                "next-token distributions, so they must share a vocabulary. Use a teacher of the same tokenizer."
            )
        teacher.eval()
        teacher.requires_grad_(False)
        return teacher

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["prompt"]

    # ----------------------------------------------------------------------------------------- generation
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The step's micro-batches of prompts, tied together: the first one trained on generates for all (in
        `_prepare_inputs`, after transformers has restored the RNG state of a resumed run)."""
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        step = _StepPrompts(batches)
        return [{"step": step, "index": i} for i in range(len(batches))], num_items

    def _prepare_inputs(self, inputs):
        if isinstance(inputs, dict) and "step" in inputs:
            return inputs["step"].micro_batch(self, inputs["index"])
        return super()._prepare_inputs(inputs)

    def _generate_step(self, batches: list[list[dict]]) -> list[dict]:
        """The student completes every prompt of the step in one generation call; split back into micro-batches,
        each with the step's completion-token count per process."""
        rollout = self._generate([row for batch in batches for row in batch])
        tokens = self.accelerator.reduce(rollout["completion_mask"].sum().float(), reduction="sum")
        per_process = tokens / self.accelerator.num_processes  # DDP averages the processes' gradients
        out, start = [], 0
        for batch in batches:
            part = {k: v[start : start + len(batch)] for k, v in rollout.items()}
            out.append({**part, "step_tokens": per_process})
            start += len(batch)
        return out

    @torch.no_grad()
    def _generate(self, rows: list[dict]) -> dict[str, Tensor]:
        """``prompt_ids, prompt_mask`` (N, P) left-padded, ``completion_ids, completion_mask`` (N, C)."""
        device = self.accelerator.device
        prompts = [r["prompt"] for r in rows]
        texts = prompts_to_text(self.processing_class, prompts, self.args.chat_template_kwargs)
        text_prompts = not is_conversational(prompts[0])  # TRL 1.16: text gets the special tokens (a BOS)
        prompt_ids, prompt_mask = tokenize_prompts(self.processing_class, texts, None, text_prompts)
        with generation_context(self) as policy:  # ZeRO-3: gathered once (ds3_gather_for_generation)
            if self._synced_step != self.state.global_step:  # vLLM: once per optimizer step (no-op for generate)
                with gathered_parameters(policy.parameters() if self.args.use_vllm else []):
                    self.generator.sync_weights(policy)  # ZeRO-3 without gathering: whole weights for vLLM
                self._synced_step = self.state.global_step
            out = self.generator.generate(prompt_ids.to(device), prompt_mask.to(device))
        mode = "train" if self.model.training else "eval"
        lengths = self.accelerator.gather(out.completion_mask.sum(1)).float()
        self._metrics[mode]["completions/mean_length"].append(lengths.mean().item())
        self._metrics[mode]["completions/clipped_ratio"].append(
            self.accelerator.gather(out.truncated).float().mean().item()
        )
        if self.args.log_completions:
            decoded = self.processing_class.batch_decode(out.completion_ids, skip_special_tokens=True)
            self._last_completions = list(zip(texts, decoded))
        return {
            "prompt_ids": prompt_ids.to(device),
            "prompt_mask": prompt_mask.to(device),
            "completion_ids": out.completion_ids,
            "completion_mask": out.completion_mask,
        }

    # ----------------------------------------------------------------------------------------- loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if isinstance(inputs, list):  # evaluation: prompts straight from the dataloader
            inputs = self._generate(inputs)
        per_token = self.token_divergences(model, inputs)
        if model.training:
            loss = per_token.sum() / inputs["step_tokens"].clamp(min=1.0)
        else:
            loss = per_token.sum() / max(per_token.numel(), 1)
        mode = "train" if model.training else "eval"
        sums = torch.stack([per_token.detach().sum(), torch.tensor(float(per_token.numel()), device=per_token.device)])
        total, count = self.accelerator.reduce(sums, reduction="sum").tolist()
        self._metrics[mode]["divergence"].append(total / max(count, 1.0))
        return (loss, None) if return_outputs else loss

    def token_divergences(self, model, inputs: dict[str, Tensor]) -> Tensor:
        """The generalised JSD at every real completion position, flat ``(T,)`` in row-major order."""
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        width = inputs["completion_ids"].shape[1]
        kwargs = {"input_ids": ids, "attention_mask": mask, "logits_to_keep": width + 1, "use_cache": False}
        _, student = forward_to_head(model, **kwargs)
        with torch.no_grad():
            _, teacher = forward_to_head(self.teacher_model, **kwargs)
        real = inputs["completion_mask"].bool()  # the head input at position t predicts completion token t
        s, t = student.positions(slice(None, -1)), teacher.positions(slice(None, -1))
        return chunked_generalized_jsd(
            (s.source[real], s.weight, s.bias),
            (t.source[real], t.weight, t.bias),
            self.args.beta,
            self.args.temperature,
            self._chunk,
        )

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        rows = self._last_completions if self.args.log_completions else []
        if rows:
            limit = self.args.num_completions_to_print or len(rows)
            for prompt, completion in rows[:limit]:
                print(f"prompt: {prompt!r}  completion: {completion!r}")
            self._last_completions = []
        super().log(logs, start_time)
        if rows and self.accelerator.is_main_process:  # the trackers of report_to get the main process's rows
            log_completions_table(self, {"prompt": [p for p, _ in rows], "completion": [c for _, c in rows]})


class _StepPrompts:
    """The prompts of one optimizer step; generated for on the first request of any of its micro-batches."""

    def __init__(self, batches: list[list[dict]]):
        self.batches, self.rollouts = batches, None

    def micro_batch(self, trainer: DistillationTrainer, index: int) -> dict:
        if self.rollouts is None:
            self.rollouts = trainer._generate_step(self.batches)
        return self.rollouts[index]
