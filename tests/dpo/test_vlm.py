"""DPO with images on the prompt, on the tiny Qwen2-VL, Qwen2.5-VL, LLaVA and Gemma 3 stand-ins through `train()`:
precomputed reference log-probs and the first step's policy log-probs equal the model's own forward."""

import pytest
import torch
import transformers
from datasets import Dataset
from packaging.version import Version

from replayrl import DPOConfig, DPOTrainer
from replayrl.data.vision import prepare_multimodal_messages
from replayrl.models.tiny_vlm import FAMILIES, IMAGE_SIZE, build_tiny_processor, build_tiny_vlm
from replayrl.tasks.shapes import shape_image
from tests.conftest import QUIET_CPU_RUN


def pairs(family: str, n: int = 4) -> Dataset:
    size, colours = IMAGE_SIZE[family], "RGBR"[:n]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Colour of shape {i}?"}] for i in range(n)],
            "chosen": [[{"role": "assistant", "content": f"{c}."}] for c in colours],
            "rejected": [[{"role": "assistant", "content": "I cannot see."}] for _ in colours],
            "image": [shape_image(c, "LR"[i % 2], size) for i, c in enumerate(colours)],
        }
    )


def own_sequence_logps(model, processor, row, side: str) -> float:
    """Summed log-probs of the `side` completion, the row through the model alone (no padding, no batching)."""
    prompt = prepare_multimodal_messages(row["prompt"], 1)
    full = processor.apply_chat_template(prompt + row[side], tokenize=False)
    start = processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    enc = processor(text=[full], images=[[row["image"]]], return_tensors="pt", add_special_tokens=False)
    n_prompt = processor(text=[start], images=[[row["image"]]], return_tensors="pt")["input_ids"].shape[1]
    with torch.no_grad():
        logits = model(**enc).logits[0].float()
    targets = enc["input_ids"][0, n_prompt:]
    return float(torch.log_softmax(logits[n_prompt - 1 : -1], -1).gather(1, targets[:, None]).sum())


@pytest.mark.parametrize("family", FAMILIES)
def test_dpo_with_images_matches_each_models_own_forward(family, tmp_path):
    processor, dataset = build_tiny_processor(family), pairs(family)
    args = DPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1, bf16=False,
                     precompute_ref_log_probs=True, learning_rate=1e-3, **QUIET_CPU_RUN)  # fmt: skip
    model = build_tiny_vlm(family, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=processor)
    initial = build_tiny_vlm(family, seed=0).eval()
    own = {side: [own_sequence_logps(initial, processor, r, side) for r in dataset] for side in ("chosen", "rejected")}
    for side in ("chosen", "rejected"):  # the reference (the untrained policy), precomputed row by row
        assert trainer.train_dataset[f"ref_{side}_logps"] == pytest.approx(own[side], abs=1e-5)
    trainer.train()
    first = trainer.state.log_history[0]
    for side in ("chosen", "rejected"):  # the policy's first-step log-probs (batch mean)
        assert first[f"logps/{side}"] == pytest.approx(sum(own[side]) / len(own[side]), abs=1e-5)
    after = dict(model.named_parameters())
    language = [n for n in before if "visual" not in n and "vision" not in n and "projector" not in n]
    assert all(not torch.equal(before[n], after[n]) for n in language)


def test_dpo_with_images_refuses_a_tokenizer(tmp_path):
    from replayrl.models.tiny import build_tokenizer

    args = DPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, **QUIET_CPU_RUN)
    with pytest.raises(ValueError, match="not a processor that handles images"):
        DPOTrainer(model=build_tiny_vlm("llava"), args=args, train_dataset=pairs("llava"),
                   processing_class=build_tokenizer())  # fmt: skip


def test_dpo_with_images_refuses_keep_end_and_a_text_model_in_trls_words(tmp_path):
    from replayrl.models.tiny import build_tiny_model, build_tokenizer

    dataset, processor = pairs("qwen2_vl", 2), build_tiny_processor("qwen2_vl")
    with pytest.warns(FutureWarning, match="keep_end.*deprecated"):  # TRL 1.16's deprecation
        keep_end = DPOConfig(output_dir=str(tmp_path / "o"), max_length=32, truncation_mode="keep_end", **QUIET_CPU_RUN)
    with pytest.raises(ValueError, match="truncation_mode='keep_end' is not supported for vision-language models"):
        DPOTrainer(model=build_tiny_vlm("qwen2_vl"), args=keep_end, train_dataset=dataset, processing_class=processor)
    text_model = build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = DPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, **QUIET_CPU_RUN)
    with pytest.raises(ValueError, match="vision-related.*not seem to be a vision-language model"):
        DPOTrainer(model=text_model, args=args, train_dataset=dataset, processing_class=processor)


def test_trls_vision_preference_collator_lays_out_chosen_then_rejected_rows():
    """`replayrl.dpo.DataCollatorForVisionPreference` (TRL 1.16's name): every prompt + chosen row, then every prompt +
    rejected row; `completion_mask` marks exactly the completion text; the per-token `mm_token_type_ids` has the
    rows' shape, 1 on the image tokens only; the pixels of each prompt come once per side."""
    from replayrl.dpo import DataCollatorForVisionPreference

    family = "qwen2_5_vl"
    processor, dataset = build_tiny_processor(family), pairs(family, 2)
    batch = DataCollatorForVisionPreference(processor)([dataset[0], dataset[1]])
    assert batch["input_ids"].shape[0] == 4
    if Version(transformers.__version__) >= Version("5.3.0"):  # processors return mm_token_type_ids from 5.3 on
        assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape
        assert torch.equal(batch["mm_token_type_ids"].bool(), batch["input_ids"] == processor.image_token_id)
    decode = processor.tokenizer.decode
    texts = [decode(ids[mask.bool()]) for ids, mask in zip(batch["input_ids"], batch["completion_mask"])]
    assert texts == ["R.<|im_end|>\n", "G.<|im_end|>\n", "I cannot see.<|im_end|>\n", "I cannot see.<|im_end|>\n"]
    assert batch["image_grid_thw"].shape[0] == 4  # two prompts' images, once for chosen and once for rejected
