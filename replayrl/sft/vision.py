"""SFT with images (docs/vlm.md): when a dataset has an `image`/`images` column, rows stay raw and the vision
collator (`replayrl.data.vision_collator`) runs the processor per batch, as TRL 1.16's SFT does for VLMs."""

from __future__ import annotations

from replayrl.data.vision import any_images, image_token_ids, is_processor
from replayrl.data.vision_collator import VisionSFTCollator

# The raw columns the vision collator reads (Trainer drops the others unless remove_unused_columns=False).
VISION_SFT_COLUMNS = ["messages", "prompt", "completion", "image", "images"]


def is_vision_sft(train_dataset, eval_dataset) -> bool:
    return any_images(train_dataset, eval_dataset)


def check_vision_sft(args, processing_class, formatting_func) -> None:
    """What SFT with images does not support (yet): each a ValueError before the model is used."""
    if not is_processor(processing_class):
        raise ValueError(
            f"the dataset has an 'image'/'images' column but processing_class is a {type(processing_class).__name__}, "
            "not a processor that handles images: pass the model's processor (AutoProcessor.from_pretrained(...))."
        )
    refused = [
        (args.packing, "packing=True"),
        (args.padding_free, "padding_free=True"),
        (args.assistant_only_loss, "assistant_only_loss=True"),
        (formatting_func is not None, "formatting_func"),
        ((args.dataset_kwargs or {}).get("skip_prepare_dataset"), "dataset_kwargs={'skip_prepare_dataset': True}"),
    ]
    for given, name in refused:
        if given:
            raise ValueError(
                f"{name} with an image dataset is not supported by replayrl's SFT yet (docs/vlm.md): drop it. Rows "
                "with images are collated raw: 'messages', or 'prompt' + 'completion' (completion-only loss)."
            )


def vision_collator(model, processing_class, args) -> VisionSFTCollator:
    return VisionSFTCollator(
        processing_class,
        image_token_ids(model.config),
        completion_only_loss=args.completion_only_loss is not False,
        max_length=args.max_length,
        pad_to_multiple_of=args.pad_to_multiple_of,
    )
