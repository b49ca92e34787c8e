"""GRPO (and GRPO with replay) on vision-language models: the tiny Qwen2-VL, Qwen2.5-VL, LLaVA and Gemma 3 stand-ins
trained through `train()` on image rows, checking what reached the loss against each model's own forward."""

import pytest
import torch
from datasets import Dataset

from replayrl import (
    GRPOConfig,
    GRPOTrainer,
    GRPOWithReplayBufferConfig,
    GRPOWithReplayBufferTrainer,
    RLOOConfig,
    RLOOTrainer,
)
from replayrl.checkpoints import load_extra_state, save_extra_state
from replayrl.data.vision import prepare_multimodal_messages
from replayrl.models.tiny_vlm import FAMILIES, IMAGE_SIZE, build_tiny_processor, build_tiny_vlm
from replayrl.tasks.shapes import shape_image
from tests.conftest import tiny_args


def image_rows(family: str, n: int = 4) -> Dataset:
    """n rows, each with its own prompt text and its own image (so a row's prompt ids name its image)."""
    size, colours = IMAGE_SIZE[family], "RGB"
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Shape {i}: colour?"}] for i in range(n)],
            "image": [
                shape_image(colours[i % 3], "LR"[i % 2], size, ["square", "circle"][i // 2 % 2]) for i in range(n)
            ],
            "index": list(range(n)),
        }
    )


def length_reward(completions, **kwargs):
    """Varied scores (so groups have signal) that depend on the sampled text only."""
    return [float(sum(map(ord, c[0]["content"])) % 5) for c in completions]


class Recording:
    """Records every batch that reaches the loss in training."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append(inputs.rows(slice(None)))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class RecordingGRPO(Recording, GRPOTrainer):
    seen: list


class RecordingReplay(Recording, GRPOWithReplayBufferTrainer):
    seen: list


class RecordingRLOO(Recording, RLOOTrainer):
    seen: list


TRAINERS = {
    "grpo": (RecordingGRPO, GRPOConfig, {}),
    "replay": (RecordingReplay, GRPOWithReplayBufferConfig, {"replay_buffer_size": 4}),
    "rloo": (RecordingRLOO, RLOOConfig, {}),
}


def reference_inputs(processor, dataset):
    """Each row's prompt ids and image inputs, made by the processor alone (not by the trainer's code)."""
    out = []
    for row in dataset:
        messages = prepare_multimodal_messages(row["prompt"], 1)
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = processor(text=[text], images=[[row["image"]]], return_tensors="pt", add_special_tokens=False)
        out.append(enc)
    return out


def own_logps(model, enc, completion: torch.Tensor, temperature: float) -> torch.Tensor:
    """The model's own forward on one row (prompt + real completion, no padding): log-probs of the completion."""
    inputs = {k: v for k, v in enc.items()}
    ids = torch.cat([enc["input_ids"], completion[None]], 1)
    inputs["input_ids"], inputs["attention_mask"] = ids, torch.ones_like(ids)
    for key in ("token_type_ids", "mm_token_type_ids"):
        if key in inputs:
            inputs[key] = torch.cat([inputs[key], torch.zeros_like(completion[None])], 1)
    with torch.no_grad():
        logits = model(**inputs).logits[0, enc["input_ids"].shape[1] - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, completion[:, None]).squeeze(1)


def match_rows(batch, refs) -> list[int]:
    """The dataset row of each batch row, found by its real prompt ids."""
    found = []
    for ids, mask in zip(batch.prompt_ids, batch.prompt_mask):
        real = ids[mask.bool()].tolist()
        hits = [k for k, enc in enumerate(refs) if enc["input_ids"][0].tolist() == real]
        assert len(hits) == 1, "a batch row's prompt ids are not exactly one dataset row's processor output"
        found.append(hits[0])
    return found


@pytest.mark.parametrize("algo", sorted(TRAINERS))
@pytest.mark.parametrize("family", FAMILIES)
def test_each_vlm_trains_on_its_images_with_the_models_own_logps(family, algo, tmp_path):
    """GRPO and RLOO, two optimizer steps per generation (so the behaviour log-probs come from a forward before the
    update) with a KL term (a frozen reference): both stored log-prob sets equal the model's own forward on the
    processor's inputs, to 1e-5 in fp32; and every weight of the language model moved."""
    processor, dataset = build_tiny_processor(family), image_rows(family)
    model = build_tiny_vlm(family, seed=0)
    trainer_cls, config_cls, extra = TRAINERS[algo]
    args = tiny_args(config_cls, tmp_path, per_device_train_batch_size=4, num_generations=2, steps_per_generation=2,
                     max_steps=2, beta=0.1, temperature=0.9, max_prompt_length=None, bf16=False, **extra)  # fmt: skip
    trainer = trainer_cls(model=model, reward_funcs=length_reward, args=args, train_dataset=dataset,
                          processing_class=processor)  # fmt: skip
    trainer.seen = []
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    initial = build_tiny_vlm(family, seed=0).eval()  # the weights the reference and the first behaviour pass had
    refs = reference_inputs(processor, dataset)
    batch = trainer.seen[0]
    assert batch.vision is not None and len(batch.vision.items) == batch.num_rows // 2  # one copy per group
    for i, k in enumerate(match_rows(batch, refs)):
        real = batch.completion_mask[i].bool()
        expected = own_logps(initial, refs[k], batch.completion_ids[i][real], 0.9)
        torch.testing.assert_close(batch.ref_logps[i][real], expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(batch.old_logps[i][real], expected, atol=1e-5, rtol=0)
    language = [n for n in before if "visual" not in n and "vision" not in n and "projector" not in n]
    moved = [n for n in language if not torch.equal(before[n], dict(model.named_parameters())[n])]
    assert len(moved) == len(language), sorted(set(language) - set(moved))[:5]


def test_the_loss_pass_uses_the_rows_images(tmp_path):
    """The policy's loss-pass log-probs of a row change when the row is given another prompt's image: the pixels
    reach the loss (a forward that ignored them would give the same values)."""
    family = "qwen2_vl"
    processor, dataset = build_tiny_processor(family), image_rows(family)
    args = tiny_args(GRPOConfig, tmp_path, num_generations=2, max_steps=1, max_prompt_length=None)
    trainer = RecordingGRPO(model=build_tiny_vlm(family), reward_funcs=length_reward, args=args,
                            train_dataset=dataset, processing_class=processor)  # fmt: skip
    trainer.seen = []
    trainer.train()
    batch = trainer.seen[0]
    with torch.no_grad():
        logps = trainer._token_logps(trainer.model, batch)[0]
        swapped = batch.with_(vision=batch.vision.__class__(batch.vision.items[::-1], batch.vision.row_item))
        other = trainer._token_logps(trainer.model, swapped)[0]
    real = batch.completion_mask.bool()
    assert (logps - other)[real].abs().max() > 1e-4


def zero_std_for_even(completions, index, **kwargs):
    """Rows of even dataset index: every completion scores 0 (zero-std groups, to be replaced from the buffer)."""
    return [0.0 if k % 2 == 0 else float(sum(map(ord, c[0]["content"])) % 5) for c, k in zip(completions, index)]


@pytest.mark.parametrize("family", FAMILIES)
def test_replayed_vlm_groups_train_on_exactly_the_images_they_were_generated_with(family, tmp_path):
    processor, dataset = build_tiny_processor(family), image_rows(family, n=8)
    args = tiny_args(GRPOWithReplayBufferConfig, tmp_path, per_device_train_batch_size=4, num_generations=2,
                     max_steps=6, replay_buffer_size=4, beta=0.0, max_prompt_length=None)  # fmt: skip
    trainer = RecordingReplay(model=build_tiny_vlm(family), reward_funcs=zero_std_for_even, args=args,
                              train_dataset=dataset, processing_class=processor)  # fmt: skip
    trainer.seen = []
    trainer.train()
    refs = reference_inputs(processor, dataset)
    replayed = 0
    for batch in trainer.seen:
        rows = match_rows(batch, refs)
        inputs = batch.model_inputs()
        offsets = dict.fromkeys(inputs, 0)
        for i, k in enumerate(rows):  # every image input each row is trained with is its own prompt's image's
            for key in offsets:
                if key in ("token_type_ids", "mm_token_type_ids"):  # per token: the row's prompt positions
                    real = batch.prompt_mask[i].bool()
                    assert torch.equal(inputs[key][i, : real.numel()][real], refs[k][key][0])
                    continue
                n = refs[k][key].shape[0]
                assert torch.equal(inputs[key][offsets[key] : offsets[key] + n], refs[k][key])
                offsets[key] += n
            replayed += int(batch.replayed[i])
    assert replayed > 0
    assert trainer.replay_buffer.groups
    for group in trainer.replay_buffer.groups:
        assert len(group.rollout.vision.items) == 1  # one copy of the pixels per stored group, not per completion
    # the buffer's images survive a checkpoint (tensors + JSON, no pickle) into a fresh trainer
    save_extra_state(tmp_path / "ckpt", "replay", trainer._extra_state())
    fresh = GRPOWithReplayBufferTrainer(model=build_tiny_vlm(family), reward_funcs=zero_std_for_even, args=args,
                                        train_dataset=dataset, processing_class=processor)  # fmt: skip
    fresh._load_extra_state(load_extra_state(tmp_path / "ckpt", "replay"))
    assert len(fresh.replay_buffer.groups) == len(trainer.replay_buffer.groups)
    for a, b in zip(trainer.replay_buffer.groups, fresh.replay_buffer.groups):
        assert torch.equal(a.rollout.prompt_ids, b.rollout.prompt_ids)
        assert torch.equal(a.rollout.vision.row_item, b.rollout.vision.row_item)
        for key, value in a.rollout.vision.items[0].items():
            assert torch.equal(value, b.rollout.vision.items[0][key])


def test_a_vlm_given_by_path_loads_with_its_processor_as_trl_does(tmp_path):
    """A saved VLM loads with AutoModelForImageTextToText and, with no processing_class, AutoProcessor; it trains
    and evaluates (generation and the loss with images, no buffer) on image rows."""
    family = "llava"
    build_tiny_vlm(family).save_pretrained(tmp_path / "llava")
    build_tiny_processor(family).save_pretrained(tmp_path / "llava")
    args = tiny_args(GRPOConfig, tmp_path, num_generations=2, max_steps=1, max_prompt_length=None,
                     per_device_eval_batch_size=4)  # fmt: skip
    trainer = GRPOTrainer(model=str(tmp_path / "llava"), reward_funcs=length_reward, args=args,
                          train_dataset=image_rows(family), eval_dataset=image_rows(family))  # fmt: skip
    assert type(trainer.model).__name__ == "LlavaForConditionalGeneration"
    assert type(trainer.processing_class).__name__ == "LlavaProcessor"
    trainer.train()
    assert trainer.state.global_step == 1
    metrics = trainer.evaluate()
    assert "eval_reward" in metrics and metrics["eval_completion_length"] > 0


def test_grpo_with_lora_on_the_language_model_keeps_the_vision_tower_and_the_base_as_reference(tmp_path):
    """LoRA on the language model's attention only: the reference log-probs (adapter off) are the untrained
    model's own, and the vision tower and every base weight stay as they were."""
    from peft import LoraConfig

    family = "qwen2_vl"
    processor, dataset = build_tiny_processor(family), image_rows(family)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj)", lora_dropout=0.0)
    args = tiny_args(GRPOConfig, tmp_path, num_generations=2, max_steps=2, beta=0.1, max_prompt_length=None)
    trainer = RecordingGRPO(model=build_tiny_vlm(family, seed=0), reward_funcs=length_reward, args=args,
                            train_dataset=dataset, processing_class=processor, peft_config=lora)  # fmt: skip
    trainer.seen = []
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    trainer.train()
    params = dict(trainer.model.named_parameters())
    assert lora_before and all(not torch.equal(lora_before[n], params[n]) for n in lora_before if "lora_B" in n)
    assert all(torch.equal(base_before[n], params[n]) for n in base_before)  # vision tower included
    initial, refs = build_tiny_vlm(family, seed=0).eval(), reference_inputs(processor, dataset)
    batch = trainer.seen[-1]  # after the first update: the reference is still the base model
    for i, k in enumerate(match_rows(batch, refs)):
        real = batch.completion_mask[i].bool()
        expected = own_logps(initial, refs[k], batch.completion_ids[i][real], args.temperature)
        torch.testing.assert_close(batch.ref_logps[i][real], expected, atol=1e-5, rtol=0)


def test_resuming_mid_generation_restores_the_batch_with_its_images(tmp_path):
    """A checkpoint taken between the two optimizer steps one generation serves holds the pending micro-batch with
    its image inputs (tensors + JSON); the resumed run trains on exactly what the uninterrupted run did."""
    family = "gemma3"
    processor, dataset = build_tiny_processor(family), image_rows(family)

    def run(out, **overrides):
        args = tiny_args(GRPOConfig, out, num_generations=2, steps_per_generation=2, max_steps=2,
                         max_prompt_length=None, save_strategy="steps", save_steps=1, **overrides)  # fmt: skip
        trainer = RecordingGRPO(model=build_tiny_vlm(family, seed=0), reward_funcs=length_reward, args=args,
                                train_dataset=dataset, processing_class=processor)  # fmt: skip
        trainer.seen = []
        return trainer

    full = run(tmp_path / "full")
    full.train()
    resumed = run(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "out" / "checkpoint-1"))
    assert len(resumed.seen) == 1  # the second micro-batch only: no new generation after the resume
    a, b = full.seen[1], resumed.seen[0]
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.prompt_ids, b.prompt_ids)
    for key, value in a.model_inputs().items():
        assert torch.equal(value, b.model_inputs()[key]), key
