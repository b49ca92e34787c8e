"""DPO with images on the prompt (docs/vlm.md): raw preference rows collated by the processor
(`replayrl.data.vision_collator.VisionDPOCollator`); chosen and rejected rows see the same prompt images."""

from __future__ import annotations

from replayrl.data.vision import image_token_ids, is_processor, text_tokenizer
from replayrl.data.vision_collator import VisionDPOCollator
from replayrl.models.loading import check_vision_model

# The raw columns the vision collator reads, and the precomputed reference log-probs.
VISION_DPO_COLUMNS = ["prompt", "chosen", "rejected", "image", "images", "ref_chosen_logps", "ref_rejected_logps"]


def check_vision_dpo(args, model, processing_class) -> None:
    """What DPO with images needs and refuses (TRL 1.16's rules, in its words where it has them)."""
    check_vision_model(model)
    if args.max_length is not None and args.truncation_mode == "keep_end":
        raise ValueError(
            "truncation_mode='keep_end' is not supported for vision-language models. Image tokens reside inside the "
            "prompt portion of the sequence, which keep_end may drop. Use truncation_mode='keep_start' (the default) "
            "or set max_length=None."
        )
    if not is_processor(processing_class):
        raise ValueError(
            f"the dataset has an 'image'/'images' column but processing_class is a {type(processing_class).__name__}, "
            "not a processor that handles images: pass the model's processor (AutoProcessor.from_pretrained(...))."
        )
    if args.padding_free:
        raise ValueError("padding_free=True with an image dataset is not supported by replayrl's DPO yet: drop it.")


def vision_dpo_collator(model, processing_class, args) -> VisionDPOCollator:
    text_tokenizer(processing_class)  # a processor: its tokenizer pads
    return VisionDPOCollator(processing_class, image_token_ids(model.config), args.label_pad_token_id, args.max_length)
