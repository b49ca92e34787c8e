"""Model cards: the `README.md` every trainer writes beside the weights it saves (TRL's `create_model_card`).

A card names the base model and dataset when they are known, the trainer and its method's paper (with BibTeX),
replayrl's citation, a quick-start snippet that loads the model, the framework versions, and what replayrl knows
that TRL's card does not: the replay settings and the run's headline figures from its `metrics.jsonl` (reward at
the start and the end, completions generated), with `training.png` beside it. The front matter is the Hub's
(`huggingface_hub.ModelCardData`), so the Hub shows the card as the model's page.

`ModelCardMixin` wires it into every `transformers.Trainer`-based trainer (through `SafeCheckpointsMixin`):
`save_model(dir)` writes the card into `dir`; `create_model_card()` (which `Trainer.push_to_hub` calls before
uploading `output_dir`) and every checkpoint save write it into `output_dir`. PPO and DDPO call `write_model_card`
from their own save paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, is_dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics, series, summary_lines

CARD_FILE = "README.md"
REPO_URL = "https://github.com/replayrl/replayrl"
Usage = Literal["text-generation", "reward", "diffusion"]


@dataclass(frozen=True)
class Method:
    """A trainer's method on its card: the paper (arXiv id, title, BibTeX) and how the saved model is loaded."""

    paper_title: str | None = None
    paper_id: str | None = None  # arXiv id
    citation: str | None = None  # BibTeX
    usage: Usage = "text-generation"

    def as_trl_paper(self) -> dict[str, str]:
        """TRL's `trainer._paper`: {"title", "id", "citation"} (empty without a paper)."""
        if self.paper_id is None:
            return {}
        return {"title": self.paper_title, "id": self.paper_id, "citation": self.citation}


_GRPO = Method(
    "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
    "2402.03300",
    """@article{shao2024deepseekmath,
    title        = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author       = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang
                   and Y. K. Li and Y. Wu and Daya Guo},
    year         = 2024,
    eprint       = {arXiv:2402.03300},
}""",
)
# Keyed by the trainer's `_name` (TRL's names). SFT has no method paper, as in TRL.
METHODS: dict[str, Method] = {
    "GRPO": _GRPO,
    "GRPO with replay buffer": _GRPO,
    "RLOO": Method(
        "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
        "2402.14740",
        """@inproceedings{ahmadian2024back,
    title        = {{Back to Basics: Revisiting REINFORCE-Style Optimization for Learning from Human Feedback in LLMs}},
    author       = {Arash Ahmadian and Chris Cremer and Matthias Gall{\\'{e}} and Marzieh Fadaee
                   and Julia Kreutzer and Olivier Pietquin and Ahmet {\\"{U}}st{\\"{u}}n and Sara Hooker},
    year         = 2024,
    booktitle    = {Proceedings of the 62nd Annual Meeting of the Association for Computational Linguistics},
}""",
    ),
    "SFT": Method(),
    "Reward": Method(
        "Training language models to follow instructions with human feedback",
        "2203.02155",
        """@inproceedings{ouyang2022training,
    title        = {{Training language models to follow instructions with human feedback}},
    author       = {Long Ouyang and Jeff Wu and Xu Jiang and Diogo Almeida and Carroll L. Wainwright
                   and Pamela Mishkin and Chong Zhang and Sandhini Agarwal and Katarina Slama and Alex Ray
                   and others},
    year         = 2022,
    booktitle    = {Advances in Neural Information Processing Systems 35},
}""",
        usage="reward",
    ),
    "DPO": Method(
        "Direct Preference Optimization: Your Language Model is Secretly a Reward Model",
        "2305.18290",
        """@inproceedings{rafailov2023direct,
    title        = {{Direct Preference Optimization: Your Language Model is Secretly a Reward Model}},
    author       = {Rafael Rafailov and Archit Sharma and Eric Mitchell and Christopher D. Manning
                   and Stefano Ermon and Chelsea Finn},
    year         = 2023,
    booktitle    = {Advances in Neural Information Processing Systems 36},
}""",
    ),
    "KTO": Method(
        "KTO: Model Alignment as Prospect Theoretic Optimization",
        "2402.01306",
        """@article{ethayarajh2024kto,
    title        = {{KTO: Model Alignment as Prospect Theoretic Optimization}},
    author       = {Kawin Ethayarajh and Winnie Xu and Niklas Muennighoff and Dan Jurafsky and Douwe Kiela},
    year         = 2024,
    eprint       = {arXiv:2402.01306},
}""",
    ),
    "Distillation": Method(
        "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes",
        "2306.13649",
        """@inproceedings{agarwal2024on-policy,
    title        = {{On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes}},
    author       = {Rishabh Agarwal and Nino Vieillard and Yongchao Zhou and Piotr Stanczyk
                   and Sabela Ramos Garea and Matthieu Geist and Olivier Bachem},
    year         = 2024,
    booktitle    = {The Twelfth International Conference on Learning Representations},
}""",
    ),
    "PPO": Method(
        "Fine-Tuning Language Models from Human Preferences",
        "1909.08593",
        """@article{ziegler2019fine-tuning,
    title        = {{Fine-Tuning Language Models from Human Preferences}},
    author       = {Daniel M. Ziegler and Nisan Stiennon and Jeffrey Wu and Tom B. Brown and Alec Radford
                   and Dario Amodei and Paul F. Christiano and Geoffrey Irving},
    year         = 2019,
    eprint       = {arXiv:1909.08593},
}""",
    ),
    "DDPO": Method(
        "Training Diffusion Models with Reinforcement Learning",
        "2305.13301",
        """@inproceedings{black2024training,
    title        = {{Training Diffusion Models with Reinforcement Learning}},
    author       = {Kevin Black and Michael Janner and Yilun Du and Ilya Kostrikov and Sergey Levine},
    year         = 2024,
    booktitle    = {The Twelfth International Conference on Learning Representations},
}""",
        usage="diffusion",
    ),
}

REPLAYRL_CITATION = """@software{replayrl,
    title        = {{replayrl: GRPO with a replay buffer, done right}},
    year         = 2026,
    howpublished = {\\url{https://github.com/replayrl/replayrl}},
    note         = {TRL-compatible RL post-training for language models}
}"""

# The card's versions (TRL's: TRL, Transformers, Pytorch, Datasets, Tokenizers), then what was installed of the rest.
CARD_PACKAGES = ("replayrl", "transformers", "torch", "datasets", "tokenizers", "accelerate")
OPTIONAL_CARD_PACKAGES = ("peft", "diffusers", "vllm", "deepspeed")


def package_version(name: str) -> str | None:
    """The installed version of distribution `name`, None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def framework_versions() -> dict[str, str]:
    """{package: version} of the card's packages, the optional ones only when installed."""
    found = {name: package_version(name) for name in (*CARD_PACKAGES, *OPTIONAL_CARD_PACKAGES)}
    return {name: v or "not installed" for name, v in found.items() if v or name in CARD_PACKAGES}


def hub_base_model(name_or_path: str | None) -> str | None:
    """The base model as the Hub names it: a model id, never a local folder (TRL's rule)."""
    if not name_or_path or os.path.isdir(name_or_path) or os.path.isabs(name_or_path):
        return None
    return name_or_path


def replay_settings(args: Any) -> dict[str, Any]:
    """The `replay_*` fields of a config (empty for a trainer without a replay buffer)."""
    if not is_dataclass(args):
        return {}
    return {f.name: getattr(args, f.name) for f in fields(args) if f.name.startswith("replay_")}


def headline_figures(records: list[dict], extra: dict[str, Any] | None = None) -> list[str]:
    """The run in a few lines: reward (and replay) from `metrics.summary_lines`, the training loss at the start
    and the end when no reward was logged, then `extra` ({label: value}, e.g. completions generated)."""
    lines = summary_lines(records)
    if not any(line.startswith("reward") for line in lines):
        _, losses = series(records, "loss")
        if losses:
            lines.insert(0, f"training loss: {losses[0]:.4f} -> {losses[-1]:.4f} (first / last log)")
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    if steps:
        lines.append(f"optimizer steps: {max(steps)}")
    lines += [f"{label}: {value}" for label, value in (extra or {}).items()]
    return lines


@dataclass
class CardInfo:
    """What a card says. `figures`: lines for the headline figures; `settings`: the replay settings."""

    trainer_name: str
    trainer_class: str
    model_name: str
    base_model: str | None = None
    dataset_name: str | None = None
    hub_model_id: str | None = None
    tags: tuple[str, ...] = ()
    settings: dict[str, Any] | None = None
    figures: tuple[str, ...] = ()
    plot: bool = False
    lora: bool = False  # the folder holds LoRA weights only (DDPO with use_lora)


_QUICK_START: dict[str, str] = {
    "text-generation": """from transformers import pipeline

question = "If you could go to the past or the future once and never return, which would you choose and why?"
generator = pipeline("text-generation", model="{model}")
output = generator([{{"role": "user", "content": question}}], max_new_tokens=128, return_full_text=False)[0]
print(output["generated_text"])""",
    "reward": """from transformers import AutoModelForSequenceClassification, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{model}")
model = AutoModelForSequenceClassification.from_pretrained("{model}")
inputs = tokenizer("The sky is blue.", return_tensors="pt")
print(model(**inputs).logits[0, 0].item())  # the reward: higher is preferred""",
    "diffusion": """from diffusers import StableDiffusionPipeline

pipe = StableDiffusionPipeline.from_pretrained("{model}")
image = pipe("a photo of a cat").images[0]""",
    "diffusion-lora": """from diffusers import StableDiffusionPipeline

pipe = StableDiffusionPipeline.from_pretrained("{base}")
pipe.load_lora_weights("{model}")  # the trained LoRA of the UNet
image = pipe("a photo of a cat").images[0]""",
}
LORA_WEIGHTS = "pytorch_lora_weights.safetensors"  # what a LoRA DDPO run saves


def render_card(info: CardInfo) -> str:
    """The card's text: Hub front matter, then the sections of TRL's card and replayrl's own."""
    from huggingface_hub import ModelCardData

    method = METHODS.get(info.trainer_name, Method())
    data = ModelCardData(
        base_model=info.base_model,
        datasets=[info.dataset_name] if info.dataset_name else None,
        library_name="diffusers" if method.usage == "diffusion" else "transformers",
        model_name=info.model_name,
        tags=["generated_from_trainer", *dict.fromkeys(info.tags)],
    )
    parts = [f"---\n{data.to_yaml()}\n---\n", f"# Model Card for {info.model_name}\n", _intro(info) + "\n"]
    model, usage = info.hub_model_id or info.model_name, method.usage
    if usage == "diffusion" and info.lora:
        usage = "diffusion-lora"
    snippet = _QUICK_START[usage].format(model=model, base=info.base_model or "<the base pipeline>")
    parts.append(f"## Quick start\n\n```python\n{snippet}\n```\n")
    parts.append("## Training procedure\n\n" + _method_line(info.trainer_name, method) + "\n")
    if info.settings:
        rows = "\n".join(f"| `{k}` | `{v!r}` |" for k, v in info.settings.items())
        parts.append(f"### Replay settings\n\n| setting | value |\n|---|---|\n{rows}\n")
    if info.figures or info.plot:
        lines = "".join(f"- {line}\n" for line in info.figures)
        picture = f"\n![Training curves]({PLOT_FILE})\n" if info.plot else ""
        parts.append(f"### Headline figures\n\nFrom the run's `{METRICS_FILE}`:\n\n{lines}{picture}")
    versions = "".join(f"- {name}: {v}\n" for name, v in framework_versions().items())
    parts.append(f"### Framework versions\n\n{versions}")
    parts.append(_citations(info.trainer_name, method))
    return "\n".join(parts)


def _intro(info: CardInfo) -> str:
    base = f"[{info.base_model}](https://huggingface.co/{info.base_model})" if info.base_model else "a model"
    text = f"This model is a fine-tuned version of {base}"
    if info.dataset_name:
        text += f" on the [{info.dataset_name}](https://huggingface.co/datasets/{info.dataset_name}) dataset"
    return text + f".\nIt has been trained using [replayrl]({REPO_URL})'s `{info.trainer_class}`."


def _method_line(name: str, method: Method) -> str:
    line = f"This model was trained with {name}"
    if method.paper_id:
        line += f", a method introduced in [{method.paper_title}](https://huggingface.co/papers/{method.paper_id})"
    return line + "."


def _citations(name: str, method: Method) -> str:
    text = "## Citations\n\n"
    if method.citation:
        text += f"Cite {name} as:\n\n```bibtex\n{method.citation}\n```\n\n"
    return text + f"Cite replayrl as:\n\n```bibtex\n{REPLAYRL_CITATION}\n```\n"


def write_model_card(directory: str | Path, info: CardInfo, metrics_dir: str | Path | None = None) -> Path:
    """Write `directory/README.md`. `metrics_dir`: first draw `directory/training.png` from its `metrics.jsonl`
    (skipped without the file or without matplotlib). The card shows the plot when `training.png` is there."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if metrics_dir is not None and (Path(metrics_dir) / METRICS_FILE).is_file():
        from replayrl.metrics.plot import PlotUnavailable, plot_run

        try:
            plot_run(metrics_dir, directory / PLOT_FILE)
        except PlotUnavailable:
            pass
    info.plot = (directory / PLOT_FILE).is_file()
    info.lora = (directory / LORA_WEIGHTS).is_file()
    path = directory / CARD_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_card(info))
    os.replace(tmp, path)  # atomic: a reader never sees half a card
    return path


def card_info_for_run(
    trainer_name: str, trainer_class: str, model_name: str, run_dir: str | Path, **kwargs: Any
) -> CardInfo:
    """A CardInfo whose figures come from `run_dir/metrics.jsonl`; `extra_figures` ({label: value}) are added."""
    extra = kwargs.pop("extra_figures", None)
    records = read_metrics(Path(run_dir) / METRICS_FILE)
    return CardInfo(trainer_name, trainer_class, model_name, figures=tuple(headline_figures(records, extra)), **kwargs)


class ModelCardMixin:
    """TRL's model-card API for a `transformers.Trainer` subclass: `_name` (the method, a key of `METHODS`;
    default: the class name without "Trainer"), `_paper` and `create_model_card`. `save_model(dir)` writes the card
    (and `training.png`) into `dir`; each checkpoint save and `push_to_hub` write it into `output_dir`, the folder
    the Hub receives. Only the main process writes."""

    _name: str | None = None
    _card_dataset_name: str | None = None

    @property
    def _paper(self) -> dict[str, str]:
        return METHODS.get(self._method_name(), Method()).as_trl_paper()

    def _method_name(self) -> str:
        return self._name or type(self).__name__.removesuffix("Trainer")

    def _model_card_figures(self) -> dict[str, Any]:
        """Hook: more headline figures, {label: value} (GRPO: the completions generated)."""
        return {}

    def _card_info(self, model_name: str | None = None, tags: str | list[str] | None = None) -> CardInfo:
        args = self.args
        if model_name is None:
            model_name = args.hub_model_id.split("/")[-1] if args.hub_model_id else Path(args.output_dir).name
        config = getattr(self.model, "config", None)
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        tags += list(getattr(self.model, "model_tags", None) or getattr(self, "_tag_names", []))
        return card_info_for_run(
            self._method_name(),
            type(self).__name__,
            model_name,
            args.output_dir,
            base_model=hub_base_model(getattr(config, "_name_or_path", None)),
            dataset_name=self._card_dataset_name,
            hub_model_id=args.hub_model_id,
            tags=tuple(tags),
            settings=replay_settings(args) if getattr(args, "replay_buffer_size", 0) else None,
            extra_figures=self._model_card_figures(),
        )

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Write the card and `training.png` into `output_dir` (TRL's signature; transformers' `dataset` keyword
        names the dataset too; at a checkpoint save the plot is not redrawn). The dataset name is kept for the cards
        written after it."""
        dataset_name = dataset_name or kwargs.get("dataset")
        if isinstance(dataset_name, str):
            self._card_dataset_name = dataset_name
        self._write_output_card(model_name, tags, draw_plot=True)

    def _write_output_card(self, model_name=None, tags=None, draw_plot: bool = False) -> None:
        if self.is_world_process_zero():
            out = self.args.output_dir
            write_model_card(out, self._card_info(model_name, tags), metrics_dir=out if draw_plot else None)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if not _internal_call and self.is_world_process_zero():
            directory = Path(output_dir or self.args.output_dir)
            name = None if self.args.hub_model_id else directory.resolve().name
            write_model_card(directory, self._card_info(name), metrics_dir=self.args.output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        self._write_output_card()  # as TRL: output_dir's card is current when a checkpoint is pushed
        super()._save_checkpoint(model, trial)


def write_card_for_run(
    directory: str | Path, trainer: Any, name: str, run_dir: str | Path | None, base_model: str | None = None
) -> Path:
    """The card of a trainer with its own loop (PPO, DDPO): `name` is its `METHODS` key, `run_dir` holds its
    `metrics.jsonl`, `base_model` is a model's `name_or_path` (kept only when it is a Hub id)."""
    info = card_info_for_run(
        name,
        type(trainer).__name__,
        Path(directory).resolve().name,
        run_dir if run_dir is not None else directory,
        base_model=hub_base_model(base_model),
        tags=("replayrl", name.lower()),
    )
    return write_model_card(directory, info, metrics_dir=run_dir)
