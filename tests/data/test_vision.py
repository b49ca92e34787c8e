"""Images in prompts (replayrl/data/vision.py): loading, TRL's multimodal messages, the per-prompt `VisionInputs`
store, and the refusals a trainer raises before any generation."""

import io

import pytest
import torch
from datasets import Dataset

from replayrl import GRPOConfig, GRPOTrainer, GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.data.vision import (
    VisionInputs,
    image_token_ids,
    load_image,
    prepare_multimodal_messages,
    row_images,
)
from replayrl.grpo.rollout import Rollout
from replayrl.models.tiny import build_tokenizer
from replayrl.models.tiny_vlm import build_tiny_processor, build_tiny_vlm
from replayrl.tasks.shapes import shape_dataset, shape_reward
from tests.conftest import tiny_args


def test_images_load_from_pil_path_bytes_and_dicts(tmp_path):
    from PIL import Image

    image = Image.new("L", (3, 2), 7)
    path = tmp_path / "a.png"
    image.save(path)
    raw = io.BytesIO()
    image.save(raw, format="PNG")
    for given in (image, str(path), path, raw.getvalue(), {"bytes": raw.getvalue(), "path": None}, {"path": str(path)}):
        loaded = load_image(given)
        assert loaded.mode == "RGB" and loaded.size == (3, 2) and loaded.getpixel((0, 0)) == (7, 7, 7)
    with pytest.raises(ValueError, match="PIL image, a path, bytes"):
        load_image(3)
    assert row_images({"prompt": "x"}) is None
    assert len(row_images({"images": [image, image]})) == 2 and len(row_images({"image": image})) == 1


def test_multimodal_messages_put_one_image_part_per_image_first_in_the_first_user_message():
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Colour?"}]
    out = prepare_multimodal_messages(prompt, 2)
    assert out[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    assert out[1]["content"] == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Colour?"}]
    assert prompt[1]["content"] == "Colour?"  # the dataset row is not modified
    placed = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]
    assert prepare_multimodal_messages(placed, 1) == placed  # images already placed stay where they are
    with pytest.raises(ValueError, match="conversational prompts"):
        prepare_multimodal_messages("What colour?", 1)


def vision_of(n_prompts: int, rows_per_prompt: int) -> VisionInputs:
    """Prompt k: k + 1 patches of value k, grid (1, 1, k + 1), token types [0, 1, 0] (3 real prompt tokens)."""
    items = [
        {
            "pixel_values": torch.full((k + 1, 2), float(k)),
            "image_grid_thw": torch.tensor([[1, 1, k + 1]]),
            "token_type_ids": torch.tensor([0, 1, 0]),
        }
        for k in range(n_prompts)
    ]
    return VisionInputs(items, torch.arange(n_prompts * rows_per_prompt) // rows_per_prompt)


def test_vision_inputs_select_concat_and_batch_rows_without_copying_per_row():
    vision = vision_of(3, 2)  # rows 0,1 -> prompt 0; 2,3 -> 1; 4,5 -> 2
    picked = vision[torch.tensor([5, 2])]
    assert picked.row_item.tolist() == [1, 0] and [int(i["pixel_values"][0, 0]) for i in picked.items] == [1, 2]
    assert picked.items[0]["pixel_values"] is vision.items[1]["pixel_values"]  # shared, not copied
    assert vision[slice(0, 2)].items == vision.items[:1]
    both = VisionInputs.concat([vision[slice(4, 6)], vision[slice(0, 1)]])
    assert both.row_item.tolist() == [0, 0, 1] and len(both.items) == 2
    prompt_mask = torch.tensor([[1, 1, 1, 0][::-1], [0, 1, 1, 1], [0, 1, 1, 1]])
    kwargs = both.model_kwargs(prompt_mask, completion_width=2)
    # per-image tensors concatenated in row order: prompt 2 (3 patches) twice, then prompt 0 (1 patch)
    assert kwargs["pixel_values"][:, 0].tolist() == [2, 2, 2, 2, 2, 2, 0]
    assert kwargs["image_grid_thw"].tolist() == [[1, 1, 3], [1, 1, 3], [1, 1, 1]]
    # per-token tensors on the prompt's real (left-padded) positions, 0 on padding and on the completion
    assert kwargs["token_type_ids"].tolist() == [[0, 0, 1, 0, 0, 0]] * 3
    assert both.nbytes() == sum(v.numel() * v.element_size() for i in both.items for v in i.values())


def test_rollouts_with_images_concatenate_and_round_trip_their_state():
    def rollout(vision):
        n = vision.num_rows
        ones = torch.ones(n, 4, dtype=torch.long)
        zeros = torch.zeros(n)
        return Rollout(ones, ones, ones, ones, zeros, zeros, zeros.long(), zeros.bool(), zeros.bool(), vision=vision)

    a, b = rollout(vision_of(2, 2)), rollout(vision_of(1, 2))
    both = Rollout.concat([a, b])
    assert both.vision.row_item.tolist() == [0, 0, 1, 1, 2, 2]
    again = Rollout.from_state_dict(both.state_dict())
    assert again.vision.row_item.tolist() == both.vision.row_item.tolist()
    assert all(torch.equal(x["pixel_values"], y["pixel_values"]) for x, y in zip(again.vision.items, both.vision.items))
    assert both.rows(slice(4, 6)).trim().vision.items[0] is b.vision.items[0]
    text_only = Rollout(*[getattr(a, f) for f in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")],
                        a.rewards, a.advantages, a.policy_version, a.replayed, a.truncated)  # fmt: skip
    with pytest.raises(ValueError, match="rows with images and rows without"):
        Rollout.concat([a, text_only])


def test_generation_never_samples_image_placeholders(tmp_path):
    """A completion with an image placeholder would break the forward (more placeholders than image features)."""
    model = build_tiny_vlm("qwen2_5_vl")
    assert image_token_ids(model.config) == sorted({model.config.image_token_id, model.config.video_token_id})
    args = tiny_args(GRPOConfig, tmp_path, max_prompt_length=None)
    trainer = GRPOTrainer(model=model, reward_funcs=shape_reward, args=args, train_dataset=shape_dataset(8),
                          processing_class=build_tiny_processor("qwen2_5_vl"))  # fmt: skip
    assert trainer.generation_config.suppress_tokens == image_token_ids(model.config)


def make(tmp_path, cls=GRPOTrainer, config=GRPOConfig, processing_class=None, dataset=None, **overrides):
    args = tiny_args(config, tmp_path, **{"max_prompt_length": None, **overrides})
    return cls(model=build_tiny_vlm("qwen2_vl"), reward_funcs=shape_reward, args=args,
               train_dataset=dataset if dataset is not None else shape_dataset(8),
               processing_class=processing_class or build_tiny_processor("qwen2_vl"))  # fmt: skip


def test_image_datasets_refuse_what_replayrl_cannot_train_with_them(tmp_path):
    with pytest.raises(ValueError, match="not a processor that handles images"):
        make(tmp_path, processing_class=build_tokenizer())
    with pytest.raises(ValueError, match="use_transformers_continuous_batching=True with images"):
        make(tmp_path, use_transformers_continuous_batching=True)  # as use_vllm=True (tests/vllm: vLLM's own venv)
    with pytest.raises(ValueError, match="replay_strategy='mix'"):
        make(tmp_path, GRPOWithReplayBufferTrainer, GRPOWithReplayBufferConfig, replay_buffer_size=4,
             replay_strategy="mix")  # fmt: skip


def test_prompts_with_images_are_not_truncated(tmp_path):
    """TRL refuses truncation that would cut image tokens; replayrl refuses any truncation of an image prompt."""
    with pytest.raises(ValueError, match="over max_prompt_length=8"):
        make(tmp_path, max_prompt_length=8).train()


def test_plain_text_prompts_with_images_are_refused(tmp_path):
    data = shape_dataset(8)
    data = Dataset.from_dict({"prompt": ["What colour?"] * 8, "image": data["image"], "answer": data["answer"]})
    with pytest.raises(ValueError, match="conversational prompts"):
        make(tmp_path, dataset=data).train()
