"""More of what TRL 1.16 does with vision-language models: the LLaVA-NeXT, Qwen3-VL, Qwen3.5, Idefics2/3 and Gemma 4
stand-ins through GRPO and SFT (checked like the four others, against each model's own forward; Gemma 4 also through
RLOO, GRPO with replay and DPO), batches that mix image rows with text-only rows, the completions table's images, and
saved processors with a video part (Qwen-VL, Gemma 4) loaded back without torchvision."""

import pytest
import torch
from datasets import Dataset

from replayrl import GRPOConfig
from replayrl.data.vision import load_image
from replayrl.models.processors import load_processor
from replayrl.models.tiny_vlm import MORE_FAMILIES, build_tiny_processor, build_tiny_vlm
from tests.conftest import tiny_args
from tests.dpo import test_vlm as dpo_vlm
from tests.grpo import test_vlm as grpo_vlm  # aliased: its tests are called here, not collected again
from tests.sft import test_vlm as sft_vlm


@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_more_stand_ins_train_with_the_models_own_logps(family, tmp_path):
    """GRPO: the behaviour and reference log-probs of every row equal the model's own forward (1e-5, fp32); SFT:
    the first step's loss equals the model's own completion loss (1e-5)."""
    grpo_vlm.test_each_vlm_trains_on_its_images_with_the_models_own_logps(family, "grpo", tmp_path / "grpo")
    sft_vlm.test_sft_trains_each_vlm_on_its_images_with_completion_only_loss(family, tmp_path / "sft")


def test_gemma4_trains_through_rloo_replay_and_dpo_with_the_models_own_logps(tmp_path):
    """Gemma 4 beyond GRPO and SFT: RLOO's and GRPO-with-replay's stored log-probs and DPO's reference and first-step
    log-probs equal the model's own forward (1e-5, fp32). Its image tokens attend to each other both ways, read from
    `mm_token_type_ids`: a forward without them gives other log-probs, so the trainers must carry them."""
    family = "gemma4"
    processor, model = build_tiny_processor(family), build_tiny_vlm(family).eval()
    enc = grpo_vlm.reference_inputs(processor, grpo_vlm.image_rows(family, 1))[0]
    assert enc["mm_token_type_ids"].sum() == (enc["input_ids"] == model.config.image_token_id).sum() > 0
    with torch.no_grad():
        with_types = model(**enc).logits
        without = model(**{k: v for k, v in enc.items() if k != "mm_token_type_ids"}).logits
    assert (with_types - without).abs().max() > 1e-4
    for algo in ("rloo", "replay"):
        grpo_vlm.test_each_vlm_trains_on_its_images_with_the_models_own_logps(family, algo, tmp_path / algo)
    dpo_vlm.test_dpo_with_images_matches_each_models_own_forward(family, tmp_path / "dpo")


def mixed_rows() -> Dataset:
    """Four prompts: two with one image, one with two, one without any (a text row among image rows, as TRL's
    `zen-multi-image` has); the images are placed by the prompt's own image parts."""
    from replayrl.tasks.shapes import shape_image

    image = [{"type": "image"}]
    prompts = [image + [{"type": "text", "text": "Colour?"}], [{"type": "text", "text": "Which?"}] + image * 2,
               [{"type": "text", "text": "No picture here."}], image + [{"type": "text", "text": "Side?"}]]  # fmt: skip
    images = [[shape_image("R", "L", 56)], [shape_image("G", "L", 56), shape_image("B", "R", 56)], [],
              [shape_image("B", "L", 56)]]  # fmt: skip
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts], "images": images})


def test_text_rows_train_among_image_rows_and_the_table_shows_each_rows_images(tmp_path):
    """A batch mixing image rows and a text-only row trains (the text row has no pixels, the others keep theirs),
    and with `log_completions` the completions table (TRL's `_logs`) holds each row's own prompt images."""
    family, dataset = "qwen2_vl", mixed_rows()
    args = tiny_args(GRPOConfig, tmp_path, per_device_train_batch_size=8, num_generations=2, max_steps=1,
                     max_prompt_length=None, log_completions=True, shuffle_dataset=False)  # fmt: skip
    trainer = grpo_vlm.RecordingGRPO(model=build_tiny_vlm(family), reward_funcs=grpo_vlm.length_reward, args=args,
                                     train_dataset=dataset, processing_class=build_tiny_processor(family))  # fmt: skip
    trainer.seen = []
    trainer.train()
    batch = trainer.seen[0]
    images_per_item = [len(item.get("image_grid_thw", [])) for item in batch.vision.items]
    assert sorted(images_per_item) == [0, 1, 1, 2]  # one stored item per group; the text row's has no pixels
    questions = [row[0]["content"][-1]["text"] if row[0]["content"][-1]["type"] == "text" else
                 row[0]["content"][0]["text"] for row in dataset["prompt"]]  # fmt: skip
    prompts, shown = list(trainer._logs["prompt"]), list(trainer._logs["images"])
    assert len(prompts) == len(shown) == 8
    for prompt, images in zip(prompts, shown):
        (k,) = [k for k, q in enumerate(questions) if q in prompt]
        assert [im.tobytes() for im in images] == [load_image(im).tobytes() for im in dataset[k]["images"]]


@pytest.mark.parametrize(("family", "name"), [("qwen2_5_vl", "Qwen2_5_VLProcessor"), ("gemma4", "Gemma4Processor")])
def test_a_saved_processor_with_a_video_part_loads_back_without_torchvision(family, name, tmp_path):
    """`load_processor` (what every trainer uses for a VLM given by name) loads a saved Qwen2.5-VL or Gemma 4
    processor (Gemma 4's also has an audio feature extractor, and takes its video processor by keyword); without
    torchvision the video part is left out and the processor still gives the same ids and pixels."""
    original = build_tiny_processor(family)
    original.save_pretrained(tmp_path)
    build_tiny_vlm(family).save_pretrained(tmp_path)
    loaded = load_processor(str(tmp_path))
    message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}
    text = original.apply_chat_template([message], tokenize=False, add_generation_prompt=True)
    image = load_image(mixed_rows()[0]["images"][0])
    a, b = (p(text=[text], images=[[image]], return_tensors="pt") for p in (original, loaded))
    assert type(loaded).__name__ == name
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["pixel_values"], b["pixel_values"])


@pytest.mark.parametrize("tracker", ["trackio", "wandb"])
def test_the_trackers_get_the_images_as_their_own_image_cells(tracker):
    """The completions table's `image` column reaches trackio / wandb as their Image objects (as TRL logs it), one
    list per row, a row without images an empty list."""
    backend = pytest.importorskip(tracker)
    from replayrl.metrics.trackers import _frame

    images = [[load_image(im) for im in row["images"]] for row in mixed_rows()]
    frame = _frame({"prompt": ["a", "b", "c"], "image": [images[1], [], images[0]]}, backend)
    cells = list(frame["image"])
    assert [len(c) for c in cells] == [2, 0, 1]
    assert all(isinstance(im, backend.Image) for row in cells for im in row)
