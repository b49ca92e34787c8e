"""Stand-in for TRL's `tests/testing_utils.py` when TRL's test files run against replayrl (`scripts/trl_tests.py`).

`trl_tests.py` copies this file into the temporary test package as `testing_utils.py`; the rewritten test files
import `TrlTestCase`, the `require_*` decorators and `local_dataset` from it. Written for replayrl: nothing of TRL's
file is copied. The `require_*` decorators skip exactly when TRL's do (the optional package, or the accelerator, is
missing); `TrlTestCase.tmp_dir` is pytest's `tmp_path`; `local_dataset` serves TRL's small hub datasets
(`trl-internal-testing/zen`) from local rows with the same columns.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import warnings

import pytest
import torch
from datasets import Dataset, DatasetDict

# The first words of the lines of PEP 20, as TRL's `zen` dataset uses them: 17 train prompts, 2 test prompts.
ZEN_PROMPTS = [
    "Beautiful is better than",
    "Explicit is",
    "Simple is better",
    "Complex",
    "Flat is better than",
    "Sparse is better",
    "Readability",
    "Special cases aren't special",
    "Although practicality beats",
    "Errors should never",
    "Unless explicitly",
    "In the face of ambiguity, refuse",
    "There should be one-- and preferably",
    "Although that way may not be obvious",
    "Now is better",
    "Although never is often better than",
    "If the implementation is hard to explain,",
    "If the implementation is easy to explain, it",
    "Namespaces are one honking great",
]
_SPLITS = {"train": ZEN_PROMPTS[:17], "test": ZEN_PROMPTS[17:]}


# Each prompt's PEP 20 ending (the "chosen" / "completion" text) and a wrong one (the "rejected" text).
ZEN_ENDINGS = [" ugly.", " better than implicit.", " than complex.", " is better than complicated.", " nested."]
ZEN_WRONG = [" pretty.", " worse.", " than simple.", " is fine.", " deep."]


def _zen_columns(config_name: str, prompts: list[str]) -> dict[str, list]:
    """The columns of TRL's `zen` config `config_name` (standard or conversational), for `prompts`."""
    kind = config_name.removeprefix("standard_").removeprefix("conversational_")
    chat = config_name.startswith("conversational_")
    good = [ZEN_ENDINGS[i % len(ZEN_ENDINGS)] for i in range(len(prompts))]
    bad = [ZEN_WRONG[i % len(ZEN_WRONG)] for i in range(len(prompts))]

    def user(texts):
        return [[{"role": "user", "content": t}] for t in texts] if chat else texts

    def reply(texts):
        return [[{"role": "assistant", "content": t.strip()}] for t in texts] if chat else texts

    def whole(ends):
        if chat:
            return [u + a for u, a in zip(user(prompts), reply(ends), strict=True)]
        return [p + e for p, e in zip(prompts, ends, strict=True)]

    if kind == "language_modeling":
        return {"messages": whole(good)} if chat else {"text": whole(good)}
    if kind == "prompt_only":
        return {"prompt": user(prompts)}
    if kind == "prompt_completion":
        return {"prompt": user(prompts), "completion": reply(good)}
    if kind == "preference":
        return {"prompt": user(prompts), "chosen": reply(good), "rejected": reply(bad)}
    if kind == "implicit_prompt_preference":
        return {"chosen": whole(good), "rejected": whole(bad)}
    if kind == "unpaired_preference":
        labels = [i % 2 == 0 for i in range(len(prompts))]
        ends = [g if label else b for g, b, label in zip(good, bad, labels, strict=True)]
        return {"prompt": user(prompts), "completion": reply(ends), "label": labels}
    raise FileNotFoundError(f"no local stand-in for trl-internal-testing/zen config {config_name!r}")


# `zen-multi-image`: where each prompt's images go among its text ("i" an image part, "t" the text), as TRL's rows
# place them (0 to 3 images a row; rows without an image mix text-only examples into the batches).
MULTI_IMAGE_LAYOUT = ["it", "ti", "iti", "iit", "it", "ti", "iti", "t", "tii", "iiti", "it", "ti", "itii", "t", "ti",
                      "tit", "it", "ti", "t"]  # fmt: skip


def _random_images(count: int, rng) -> list:
    """`count` RGB images of random pixels, 32-63 pixels a side (as TRL's `zen-image` rows)."""
    from PIL import Image

    sizes = rng.integers(32, 64, size=(count, 2))
    return [Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype="uint8")) for h, w in sizes]


def _with_images(columns: dict[str, list], config_name: str, split: str, multi: bool) -> dict[str, list]:
    """`zen-image` (one image a row) / `zen-multi-image` (0-3 images a row, placed by `MULTI_IMAGE_LAYOUT` in the
    first user message) columns: the `zen` columns plus an `images` column of random images."""
    import zlib

    import numpy as np

    rng = np.random.default_rng(zlib.crc32(f"{config_name}/{split}/{multi}".encode()))
    offset = 0 if split == "train" else len(_SPLITS["train"])
    n = len(next(iter(columns.values())))
    layouts = [MULTI_IMAGE_LAYOUT[offset + i] if multi else "it" for i in range(n)]
    if multi:
        key = "messages" if "messages" in columns else "prompt"
        if not config_name.startswith("conversational_"):
            raise FileNotFoundError(f"no local stand-in for trl-internal-testing/zen-multi-image {config_name!r}")
        columns[key] = [_place_images(row, layout) for row, layout in zip(columns[key], layouts, strict=True)]
    columns["images"] = [_random_images(layout.count("i"), rng) for layout in layouts]
    return columns


def _place_images(messages: list[dict], layout: str) -> list[dict]:
    """The first user message's text as typed parts, with image parts where `layout` puts them."""
    text = messages[0]["content"]
    halves = [text[: len(text) // 2], text[len(text) // 2 :]] if layout.count("t") == 2 else [text]
    parts = [{"type": "image", "text": None} if c == "i" else {"type": "text", "text": halves.pop(0)} for c in layout]
    typed = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in messages[1:]]
    return [{"role": messages[0]["role"], "content": parts}, *typed]


def _dataset_split(path: str, config_name: str, split: str) -> Dataset:
    columns = _zen_columns(config_name, _SPLITS[split])
    if path != "trl-internal-testing/zen":
        columns = _with_images(columns, config_name, split, multi=path.endswith("multi-image"))
    return Dataset.from_dict(columns)


def local_dataset(path: str, name: str | None = None, split: str | None = None, streaming: bool = False, **kwargs):
    """`datasets.load_dataset` for TRL's test datasets, served locally (same columns, PEP 20 prompts; the image
    datasets `zen-image` / `zen-multi-image` with random images)."""
    if path not in [f"trl-internal-testing/zen{suffix}" for suffix in ("", "-image", "-multi-image")]:
        raise FileNotFoundError(f"no local stand-in for the hub dataset {path!r}")
    first = re.fullmatch(r"(\w+)\[:(\d+)\]", split or "")  # "train[:2]": the first rows of a split
    if first:
        dataset = _dataset_split(path, name, first.group(1)).select(range(int(first.group(2))))
        return dataset.to_iterable_dataset() if streaming else dataset
    if split is None:
        out = DatasetDict({s: _dataset_split(path, name, s) for s in _SPLITS})
        return out if not streaming else {s: d.to_iterable_dataset() for s, d in out.items()}
    dataset = _dataset_split(path, name, split)
    return dataset.to_iterable_dataset() if streaming else dataset


# A ChatML chat template, the file that TRL's `tests/data/template.jinja` fixture directory holds (written here).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture
def lazy_shared_datadir(tmp_path_factory):
    """pytest-datadir's fixture as TRL's tests use it: a directory holding `template.jinja`."""
    path = tmp_path_factory.mktemp("data")
    (path / "template.jinja").write_text(CHAT_TEMPLATE)
    return path


def replayrl_name(module: str, name: str):
    """`module.name`; where replayrl has no such name, a stand-in that fails (naming it) when a test uses it."""
    found = getattr(importlib.import_module(module), name, None)
    if found is not None:
        return found

    def missing(*args, **kwargs):
        raise NotImplementedError(f"replayrl has no {module}.{name} (TRL's name, imported by the test file)")

    return missing


class TrlTestCase:
    """Gives each test `self.tmp_dir` (pytest's tmp_path) and runs it from there, as TRL's base class does."""

    @pytest.fixture(autouse=True)
    def _trl_tmp_dir(self, tmp_path, monkeypatch):
        self.tmp_dir = str(tmp_path)
        monkeypatch.chdir(tmp_path)


def _available(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def is_liger_kernel_available(min_version: str | None = None) -> bool:
    if not _available("liger_kernel"):
        return False
    if min_version is None:
        return True
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("liger_kernel")) >= Version(min_version)


def is_ampere_or_newer() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def get_kbit_device_map() -> dict[str, int] | None:
    """Where a quantized model is placed (TRL's helper of that name): the current accelerator, else no map."""
    return {"": torch.cuda.current_device()} if torch.cuda.is_available() else None


def _version_at_least(package: str, minimum: str) -> bool:
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version(package)) >= Version(minimum)


def _require(condition: bool, reason: str):
    return pytest.mark.skipif(not condition, reason=reason)


require_peft = _require(_available("peft"), "test requires peft")
require_bitsandbytes = _require(_available("bitsandbytes"), "test requires bitsandbytes")
require_jmespath = _require(_available("jmespath"), "test requires jmespath")
require_kernels = _require(_available("kernels"), "test requires kernels")
require_liger_kernel = _require(is_liger_kernel_available(), "test requires liger-kernel")
require_vllm = _require(_available("vllm"), "test requires vllm")
require_vision = _require(_available("PIL"), "test requires Pillow")
require_torch_accelerator = _require(torch.cuda.is_available(), "test requires an accelerator")
require_ampere_or_newer = _require(is_ampere_or_newer(), "test requires an Ampere or newer GPU")
require_peft_target_parameters = _require(
    _available("peft") and _version_at_least("peft", "0.17.0"), "test requires peft>=0.17 (LoRA target_parameters)"
)
# TRL marks the tests that fail under data parallelism (several accelerators) as expected failures.
xfail_data_parallel = pytest.mark.xfail(torch.cuda.device_count() > 1, reason="fails with data parallelism")


def ignore_warnings(message: str = "", category: type[Warning] = Warning):
    """Decorator: the test runs with warnings of `category` whose text matches `message` ignored."""

    def decorate(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=message, category=category)
                return test(*args, **kwargs)

        return run

    return decorate


require_torch_multi_accelerator = _require(torch.cuda.device_count() > 1, "test requires several accelerators")
require_torch_multi_gpu = require_torch_multi_accelerator  # TRL v0.7.1's name
require_diffusers = _require(_available("diffusers"), "test requires diffusers")

# ---- TRL v0.7.1's files (`scripts/trl_tests_v071.py` rewrites their imports to these)
# `tests/testing_constants.py`: a staging hub account. Placeholders: nothing here reaches a hub.
CI_HUB_USER = "__DUMMY_TRANSFORMERS_USER__"
CI_HUB_USER_FULL_NAME = "Dummy User"
CI_HUB_USER_TOKEN = "offline-placeholder"
CI_HUB_ENDPOINT = "https://hub-ci.invalid"


class HfApi:
    """Offline stand-in for `huggingface_hub.HfApi` (the files only construct it for tests skipped by TRL)."""

    def __init__(self, *args, **kwargs):
        pass


class HfFolder:
    """Offline stand-in: v0.7.1's PPO tests save the staging token in `setUpClass`; here nothing is written."""

    @staticmethod
    def save_token(token: str) -> None:
        pass


def delete_repo(*args, **kwargs) -> None:
    """Offline stand-in: v0.7.1's PPO tests delete their staging repository in `tearDownClass`."""


@pytest.fixture(autouse=True)
def zero_grad_as_in_2023(monkeypatch):
    """accelerate's `AcceleratedOptimizer.zero_grad()` as when TRL v0.7.1 was released: zeroed gradients rather
    than `None` (accelerate 0.28 changed the default; TRL then patched its own `param.grad is not None` checks
    the same way, TRL PR #1422). Imported into TRL v0.7.1's PPO file, it applies to that file's tests."""
    from accelerate.optimizer import AcceleratedOptimizer

    original = AcceleratedOptimizer.zero_grad

    def zero_grad(self, set_to_none=None):
        return original(self, set_to_none=False if set_to_none is None else set_to_none)

    monkeypatch.setattr(AcceleratedOptimizer, "zero_grad", zero_grad)


os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _processors_without_torchvision() -> None:
    """TRL's tests load processors with `AutoProcessor.from_pretrained`; where torchvision is missing (no CPU build
    for this torch), a Qwen-VL processor fails on its video part. Route those calls through replayrl's
    `load_processor`, which loads the same processor without it (images only), as replayrl's trainers do."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return

    try:
        from replayrl.models.processors import load_without_video, video_processor_missing
    except ImportError:  # an older replayrl (a "before" count): its processors load as it can
        return
    original = AutoProcessor.from_pretrained

    def from_pretrained(name, *args, **kwargs):
        try:
            return original(name, *args, **kwargs)
        except (ImportError, ValueError, OSError) as err:
            if not video_processor_missing(err):
                raise
            return load_without_video(name, reason=str(err), **kwargs)

    AutoProcessor.from_pretrained = staticmethod(from_pretrained)


_processors_without_torchvision()
