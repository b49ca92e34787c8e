"""SFT with images (docs/vlm.md): when a dataset has an `image`/`images` column, rows stay raw and the vision
collator (`replayrl.data.vision_collator`) runs the processor per batch, as TRL 1.16's SFT does for VLMs."""

from __future__ import annotations

from replayrl.data.sft import GENERATION_MARK
from replayrl.data.vision import any_images, image_token_ids, is_processor
from replayrl.data.vision_collator import VisionSFTCollator
from replayrl.models.loading import check_vision_model

# The raw columns the vision collator reads (Trainer drops the others unless remove_unused_columns=False).
VISION_SFT_COLUMNS = ["messages", "prompt", "completion", "image", "images"]


def is_vision_sft(train_dataset, eval_dataset) -> bool:
    return any_images(train_dataset, eval_dataset)


def check_vision_sft(args, model, processing_class, formatting_func) -> None:
    """What SFT with images needs and refuses (TRL 1.16's rules, in its words where it has them): each a ValueError
    before the model is used."""
    check_vision_model(model, **({"trust_remote_code": True} if args.trust_remote_code else {}))
    if args.packing:
        raise ValueError("Packing is not supported for vision datasets. Please set `packing=False` in the SFTConfig.")
    if args.padding_free:
        raise ValueError(
            "Padding-free training is yet not supported for vision datasets. Please set `padding_free=False` in the "
            "`SFTConfig`."
        )
    if args.max_length is not None and args.truncation_mode == "keep_end":
        raise ValueError(
            "truncation_mode='keep_end' is not supported for vision datasets: image tokens are in the prompt, at the "
            "start of the sequence. Use truncation_mode='keep_start' (the default) or set max_length=None."
        )
    if args.assistant_only_loss:
        _check_assistant_only(processing_class)
    if not is_processor(processing_class):
        raise ValueError(
            f"the dataset has an 'image'/'images' column but processing_class is a {type(processing_class).__name__}, "
            "not a processor that handles images: pass the model's processor (AutoProcessor.from_pretrained(...))."
        )
    refused = [
        (formatting_func is not None, "formatting_func"),
        ((args.dataset_kwargs or {}).get("skip_prepare_dataset"), "dataset_kwargs={'skip_prepare_dataset': True}"),
    ]
    for given, name in refused:
        if given:
            raise ValueError(
                f"{name} with an image dataset is not supported by replayrl's SFT yet (docs/vlm.md): drop it. Rows "
                "with images are collated raw: 'messages', or 'prompt' + 'completion' (completion-only loss)."
            )


def _check_assistant_only(processing_class) -> None:
    """Assistant-only loss with images: transformers >= 5.18 (TRL 1.16's words) and a template with generation marks."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.18.0.dev0"):
        raise ValueError(
            "Assistant-only loss for vision datasets requires transformers>=5.18.0. Please upgrade transformers "
            "or set `assistant_only_loss=False` in the `SFTConfig`."
        )
    if not GENERATION_MARK.search(str(getattr(processing_class, "chat_template", None) or "")):
        raise ValueError(
            "assistant_only_loss=True but the processor's chat template has no {% generation %} ... "
            "{% endgeneration %} marks around the assistant's text, so no token would be trained on. Use a template "
            "with generation marks (chat_template_path) or set assistant_only_loss=False."
        )


def vision_collator(model, processing_class, args) -> VisionSFTCollator:
    return VisionSFTCollator(
        processing_class,
        image_token_ids(model.config),
        completion_only_loss=args.completion_only_loss is not False,
        max_length=args.max_length,
        pad_to_multiple_of=args.pad_to_multiple_of,
        assistant_only_loss=args.assistant_only_loss,
    )
