"""SFT on vision-language models (the tiny Qwen2-VL, Qwen2.5-VL, LLaVA and Gemma 3 stand-ins) through `train()`: the
first step's loss equals the model's own forward on the processor's inputs, with the loss on the completion only."""

import pytest
import torch
import transformers
from datasets import Dataset
from packaging.version import Version

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
    first = trainer.state.log_history[0]  # a mixture of experts (Qwen3.5-MoE) adds its router's aux loss, as TRL
    coef = getattr(model.config.get_text_config(), "router_aux_loss_coef", 0.0)  # the model config's (the default)
    expected += coef * first.get("aux_loss", 0.0)
    assert first["loss"] == pytest.approx(expected, abs=1e-5)
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
    from replayrl.models.tiny import build_tiny_model, build_tokenizer

    def tiny_text_model():
        return build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)

    family = "qwen2_vl"
    dataset = rows(family, 2)
    with pytest.raises(ValueError, match="not a processor that handles images"):
        SFTTrainer(model=build_tiny_vlm(family), args=args(tmp_path), train_dataset=dataset,
                   processing_class=build_tokenizer())  # fmt: skip
    # TRL 1.16's refusals, in its words
    with pytest.raises(ValueError, match="Packing is not supported for vision datasets"):
        SFTTrainer(model=build_tiny_vlm(family), args=args(tmp_path, packing=True, max_length=64),
                   train_dataset=dataset, processing_class=build_tiny_processor(family))  # fmt: skip
    with pytest.raises(ValueError, match="Padding-free training is yet not supported for vision datasets"):
        SFTTrainer(model=build_tiny_vlm(family), args=args(tmp_path, padding_free=True),
                   train_dataset=dataset, processing_class=build_tiny_processor(family))  # fmt: skip
    with pytest.raises(ValueError, match="vision-related.*not seem to be a vision-language model"):
        SFTTrainer(model=tiny_text_model(), args=args(tmp_path), train_dataset=dataset,
                   processing_class=build_tiny_processor(family))  # fmt: skip


def _find(sequence: list[int], part: list[int], start: int = 0) -> int:
    return next(i for i in range(start, len(sequence) - len(part) + 1) if sequence[i : i + len(part)] == part)


def test_sft_assistant_only_loss_with_images_trains_exactly_the_assistant_turns(tmp_path):
    """assistant_only_loss with images (TRL 1.16, transformers >= 5.18): in a two-turn conversation, the trained
    tokens are each assistant reply and its <|im_end|> (found here by their own token ids, after the image
    placeholders were expanded), and the first step's loss is the model's own NLL of exactly those tokens."""
    family = "qwen2_5_vl"
    processor, data = build_tiny_processor(family), rows(family, 2)
    replies = [[c[0]["content"], "Sure."] for c in data["completion"]]
    conversations = [p + c + [{"role": "user", "content": "Really?"}, {"role": "assistant", "content": "Sure."}]
                     for p, c in zip(data["prompt"], data["completion"])]  # fmt: skip
    dataset = Dataset.from_dict({"messages": conversations, "image": data["image"]})
    model = build_tiny_vlm(family, seed=0)
    settings = args(tmp_path, per_device_train_batch_size=2, assistant_only_loss=True)
    if Version(transformers.__version__) < Version("5.18.0.dev0"):  # TRL 1.16's floor for it, in its words
        with pytest.raises(ValueError, match="requires transformers>=5.18.0"):
            SFTTrainer(model=model, args=settings, train_dataset=dataset, processing_class=processor)
        return
    trainer = SFTTrainer(model=model, args=settings, train_dataset=dataset, processing_class=processor)
    batch = trainer.data_collator([dataset[0], dataset[1]])
    initial, total, count = build_tiny_vlm(family, seed=0).eval(), 0.0, 0
    for i, row in enumerate(dataset):
        text = processor.apply_chat_template(prepare_multimodal_messages(row["messages"], 1), tokenize=False)
        enc = processor(text=[text], images=[[row["image"]]], return_tensors="pt", add_special_tokens=False)
        ids, expected = enc["input_ids"][0].tolist(), torch.zeros(batch["labels"].shape[1], dtype=torch.bool)
        at = 0
        for reply in replies[i]:
            part = processor.tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
            at = _find(ids, part, at)
            expected[at : at + len(part)] = True
            at += len(part)
        assert torch.equal(batch["labels"][i] != -100, expected)
        with torch.no_grad():
            logp = torch.log_softmax(initial(**enc).logits[0, :-1].float(), -1)
        targets = torch.tensor(ids[1:])
        picked = logp.gather(1, targets[:, None]).squeeze(1)[expected[1 : len(ids)]]
        total, count = total - float(picked.sum()), count + len(picked)
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(total / count, abs=1e-5)
