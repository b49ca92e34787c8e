"""SFT on vision-language models (the tiny Qwen2-VL, Qwen2.5-VL, LLaVA and Gemma 3 stand-ins) through `train()`: the
first step's loss equals the model's own forward on the processor's inputs, with the loss on the completion only."""

import pytest
import torch
from datasets import Dataset

from replayrl import SFTConfig, SFTTrainer
from replayrl.data.vision import prepare_multimodal_messages
from replayrl.models.tiny_vlm import FAMILIES, IMAGE_SIZE, build_tiny_processor, build_tiny_vlm
from replayrl.tasks.shapes import shape_image
from tests.conftest import QUIET_CPU_RUN


def rows(family: str, n: int = 4) -> Dataset:
    size = IMAGE_SIZE[family]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Colour of shape {i}?"}] for i in range(n)],
            "completion": [[{"role": "assistant", "content": f"It is {c}."}] for c in "RGBR"[:n]],
            "image": [shape_image(c, "LR"[i % 2], size) for i, c in enumerate("RGBR"[:n])],
        }
    )


def args(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3,
                    bf16=False, max_length=None, shuffle_dataset=False, **QUIET_CPU_RUN)  # fmt: skip
    return SFTConfig(**{**settings, **overrides})


def own_completion_loss(model, processor, dataset) -> float:
    """Mean NLL of the completion tokens over the batch, each row through the model on its own (no padding)."""
    total, count = 0.0, 0
    for row in dataset:
        prompt = prepare_multimodal_messages(row["prompt"], 1)
        full = processor.apply_chat_template(prompt + row["completion"], tokenize=False)
        start = processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        enc = processor(text=[full], images=[[row["image"]]], return_tensors="pt", add_special_tokens=False)
        n_prompt = processor(text=[start], images=[[row["image"]]], return_tensors="pt")["input_ids"].shape[1]
        with torch.no_grad():
            logits = model(**enc).logits[0].float()
        targets = enc["input_ids"][0, n_prompt:]
        logp = torch.log_softmax(logits[n_prompt - 1 : -1], -1).gather(1, targets[:, None])
        total, count = total - float(logp.sum()), count + len(targets)
    return total / count


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_trains_each_vlm_on_its_images_with_completion_only_loss(family, tmp_path):
    processor, dataset = build_tiny_processor(family), rows(family)
    model = build_tiny_vlm(family, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = SFTTrainer(model=model, args=args(tmp_path), train_dataset=dataset, processing_class=processor)
    trainer.train()
    expected = own_completion_loss(build_tiny_vlm(family, seed=0).eval(), processor, dataset)
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, abs=1e-5)
    language = [n for n in before if "visual" not in n and "vision" not in n and "projector" not in n]
    after = dict(model.named_parameters())
    assert all(not torch.equal(before[n], after[n]) for n in language)


def test_sft_collator_labels_messages_and_refuses_cutting_image_tokens(tmp_path):
    family = "llava"
    processor, data = build_tiny_processor(family), rows(family, 2)
    messages = Dataset.from_dict(
        {"messages": [p + c for p, c in zip(data["prompt"], data["completion"])], "image": data["image"]}
    )
    trainer = SFTTrainer(model=build_tiny_vlm(family), args=args(tmp_path), train_dataset=messages,
                         processing_class=processor)  # fmt: skip
    batch = trainer.data_collator([messages[0], messages[1]])
    image_id = build_tiny_vlm(family).config.image_token_id
    trained = batch["labels"] != -100
    # language modeling: every real token but the image placeholders is trained
    assert torch.equal(trained, (batch["attention_mask"] == 1) & (batch["input_ids"] != image_id))
    assert batch["pixel_values"].shape[0] == 2
    trainer.data_collator.max_length = 5  # the image tokens come after the first 5 tokens
    with pytest.raises(ValueError, match="max_length=5 would cut a row's image tokens"):
        trainer.data_collator([messages[0]])


def test_sft_with_images_refuses_what_it_cannot_do(tmp_path):
    from replayrl.models.tiny import build_tokenizer

    family = "qwen2_vl"
    dataset = rows(family, 2)
    with pytest.raises(ValueError, match="not a processor that handles images"):
        SFTTrainer(model=build_tiny_vlm(family), args=args(tmp_path), train_dataset=dataset,
                   processing_class=build_tokenizer())  # fmt: skip
    with pytest.raises(ValueError, match="packing=True with an image dataset"):
        SFTTrainer(model=build_tiny_vlm(family), args=args(tmp_path, packing=True, max_length=64),
                   train_dataset=dataset, processing_class=build_tiny_processor(family))  # fmt: skip
