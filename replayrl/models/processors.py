"""Loading a vision-language model's processor, also where its video processor cannot load.

transformers' video processors need torchvision; with a CPU-only torch there may be none that imports (the registry
here has only CUDA builds of torchvision for torch 2.13, docs/vlm.md), and `AutoProcessor.from_pretrained` then fails
for every processor that has a video part (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 4, ...) even when only images are
trained. `load_processor` falls back to the same processor class without its video processor: the image processor
(the PIL one where torchvision is missing), the tokenizer, the chat template and any other part (Gemma 4's audio
feature extractor), which is all image training needs. A processor saved that way (no video processor config) loads
back through the same fallback.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def without_video(cls):
    """`cls` (a processor class with a video processor) as a subclass that has none: built and loaded with its
    image processor, tokenizer (and any other part, e.g. Gemma 4's audio feature extractor) only. It keeps `cls`'s
    name, so `save_pretrained` records the real class. A class whose `__init__` requires a video processor, or
    passes it on by keyword (Gemma 4), gets ``video_processor=None``, which is dropped before `ProcessorMixin`."""
    if "video_processor" not in cls.get_attributes():
        return cls
    from transformers.processing_utils import ProcessorMixin

    class _DropVideo(ProcessorMixin):  # sits between `cls` and ProcessorMixin in the MRO
        def __init__(self, *args, **kwargs):
            kwargs.pop("video_processor", None)
            super().__init__(*args, **kwargs)

    class ImageOnly(cls, _DropVideo):
        video_processor = None

        @classmethod
        def get_attributes(cls_):
            return [name for name in cls.get_attributes() if name != "video_processor"]

        @classmethod
        def from_args_and_dict(cls_, args, processor_dict, **kwargs):
            return super().from_args_and_dict(args, processor_dict, **{"video_processor": None, **kwargs})

    ImageOnly.__name__ = ImageOnly.__qualname__ = cls.__name__
    return ImageOnly


def load_processor(name: str, **kwargs: Any):
    """`AutoProcessor.from_pretrained(name, **kwargs)`; where that fails only because the video processor needs
    torchvision, the model's processor class without its video processor (`load_without_video`)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(name, **kwargs)
    except (ImportError, ValueError, OSError) as err:
        if not video_processor_missing(err):
            raise
        return load_without_video(name, reason=str(err), **kwargs)


def video_processor_missing(err: Exception) -> bool:
    """Whether `AutoProcessor` failed on the video processor alone: torchvision missing, or (a processor saved
    without one) no video processor config."""
    return "torchvision" in str(err) or "video processor" in str(err).lower()


def load_without_video(name: str, reason: str = "", **kwargs: Any):
    """The processor class transformers maps `name`'s config to, loaded without its video processor, with a
    warning: images and text only."""
    cls = without_video(_processor_class(name, kwargs))
    logger.warning("%s: loading %s without its video processor (%s); images only.", name, cls.__name__, reason)
    return cls.from_pretrained(name, **kwargs)


def _processor_class(name: str, kwargs: dict):
    """The processor class transformers maps the model's config to (`AutoProcessor`'s own mapping)."""
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    remote = {k: v for k, v in kwargs.items() if k in ("trust_remote_code", "revision")}
    config = AutoConfig.from_pretrained(name, **remote)
    if type(config) not in PROCESSOR_MAPPING:
        raise ValueError(f"no processor class is known for {name!r} (model_type {config.model_type!r}).")
    return PROCESSOR_MAPPING[type(config)]
