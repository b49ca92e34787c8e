"""Model cards: every trainer's saved model folder holds a README.md that names the trainer, the method's paper
and the versions; parsed back with huggingface_hub's ModelCard (the Hub's own reader)."""

import re
from importlib.metadata import version

import pytest
import torch
from huggingface_hub import ModelCard

from replayrl.metrics import METRICS_FILE, PLOT_FILE, read_metrics, summary_lines
from replayrl.model_card import CARD_FILE, METHODS, REPLAYRL_CITATION
from replayrl.models.tiny import build_tiny_model, build_tiny_sequence_classifier, prompt_dataset
from replayrl.tasks.preferences import preference_datasets

BASE = "Qwen/Qwen2.5-0.5B-Instruct"  # what the card must name: the tiny model pretends to come from the Hub
SIZE = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
RUN = dict(max_steps=1, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, bf16=False)
RUN.update(disable_tqdm=True, learning_rate=1e-2)
GRPO_RUN = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=6, max_prompt_length=32)


def task_reward(completions, task, **kwargs):
    return [0.0 if t == "count" else float(sum(map(ord, c)) % 5) for c, t in zip(completions, task)]


def hub_model(tokenizer, seed=0):
    model = build_tiny_model(tokenizer, seed=seed, **SIZE)
    model.config._name_or_path = BASE
    return model


def build(kind: str, tokenizer, out: str, **overrides):
    """A trainer of `kind` on a tiny model that claims to be BASE, one optimizer step, writing to `out`."""
    import replayrl as r

    args = {**RUN, "output_dir": out, **overrides}
    grpo_like = {"grpo": (r.GRPOTrainer, r.GRPOConfig), "rloo": (r.RLOOTrainer, r.RLOOConfig)}
    grpo_like["replay"] = (r.GRPOWithReplayBufferTrainer, r.GRPOWithReplayBufferConfig)
    if kind in grpo_like:
        trainer_cls, config_cls = grpo_like[kind]
        config = config_cls(**{**GRPO_RUN, **args})
        data = prompt_dataset(16)
        return trainer_cls(
            hub_model(tokenizer), task_reward, args=config, train_dataset=data, processing_class=tokenizer
        )
    pairs = preference_datasets(0, 1)[0]
    if kind == "sft":
        data = pairs.select_columns(["prompt", "chosen"]).rename_column("chosen", "completion")
        return r.SFTTrainer(
            hub_model(tokenizer), args=r.SFTConfig(**args), train_dataset=data, processing_class=tokenizer
        )
    if kind == "reward":
        model = build_tiny_sequence_classifier(tokenizer, seed=0, **SIZE)
        model.config._name_or_path = BASE
        return r.RewardTrainer(model, args=r.RewardConfig(**args), train_dataset=pairs, processing_class=tokenizer)
    if kind == "dpo":
        return r.DPOTrainer(
            hub_model(tokenizer), args=r.DPOConfig(**args), train_dataset=pairs, processing_class=tokenizer
        )
    if kind == "kto":
        return r.KTOTrainer(
            hub_model(tokenizer), args=r.KTOConfig(**args), train_dataset=pairs, processing_class=tokenizer
        )
    assert kind == "distillation"
    config = r.DistillationConfig(per_device_train_batch_size=8, max_completion_length=6, **args)
    teacher = build_tiny_model(tokenizer, seed=1, **SIZE)
    data = prompt_dataset(16)
    return r.DistillationTrainer(
        hub_model(tokenizer), teacher, args=config, train_dataset=data, processing_class=tokenizer
    )


def bibtex_entries(text: str) -> list[str]:
    entries = re.findall(r"```bibtex\n(.*?)\n```", text, flags=re.S)
    for entry in entries:  # a well-formed entry: @type{key, ... } with balanced braces
        assert re.match(r"@\w+\{[\w:-]+,", entry) and entry.count("{") == entry.count("}"), entry
    return entries


def check_card(directory, name: str, trainer_class: str, base: str | None = BASE) -> ModelCard:
    """The card in `directory` parses, names the trainer, its paper (BibTeX too) and the versions."""
    card = ModelCard.load(directory / CARD_FILE)
    assert card.data.base_model == base
    assert card.data.model_name == directory.name and "generated_from_trainer" in card.data.tags
    text = card.text
    assert f"`{trainer_class}`" in text and f"This model was trained with {name}" in text
    method = METHODS[name]
    entries = bibtex_entries(text)
    assert REPLAYRL_CITATION in entries
    if method.paper_id:
        assert f"https://huggingface.co/papers/{method.paper_id}" in text and method.citation in entries
    for package in ("transformers", "torch", "datasets", "accelerate"):
        assert f"\n- {package}: {version(package)}\n" in text
    assert any(f'{call}"{directory.name}")' in text for call in ("model=", "from_pretrained(", "load_lora_weights("))
    return card


@pytest.mark.parametrize(
    ("kind", "name", "trainer_class"),
    [
        ("grpo", "GRPO", "GRPOTrainer"),
        ("rloo", "RLOO", "RLOOTrainer"),
        ("sft", "SFT", "SFTTrainer"),
        ("reward", "Reward", "RewardTrainer"),
        ("dpo", "DPO", "DPOTrainer"),
        ("kto", "KTO", "KTOTrainer"),
        ("distillation", "Distillation", "DistillationTrainer"),
    ],
)
def test_save_model_writes_the_card(kind, name, trainer_class, tokenizer, tmp_path):
    trainer = build(kind, tokenizer, str(tmp_path / "out"))
    trainer.train()
    trainer.save_model(str(tmp_path / "my-model"))
    card = check_card(tmp_path / "my-model", name, trainer_class)
    assert "- optimizer steps: 1\n" in card.text
    assert trainer._paper == METHODS[name].as_trl_paper()  # TRL's attribute
    loader = "AutoModelForSequenceClassification" if kind == "reward" else 'pipeline("text-generation"'
    assert loader in card.text


def test_grpo_with_replay_card_has_the_replay_settings_and_the_run(tokenizer, tmp_path):
    out = tmp_path / "out"
    trainer = build(
        "replay", tokenizer, str(out), max_steps=4, replay_buffer_size=8, save_strategy="steps", save_steps=2
    )
    trainer.train()
    assert (out / CARD_FILE).is_file()  # each checkpoint save refreshes output_dir's card (what a push uploads)
    assert not (out / "checkpoint-2" / CARD_FILE).exists()  # checkpoints stay as their checksums recorded them
    trainer.create_model_card(dataset_name="trl-lib/DeepMath-103K")  # what Trainer.push_to_hub calls first
    assert ModelCard.load(out / CARD_FILE).data.datasets == ["trl-lib/DeepMath-103K"]
    trainer.save_model(str(tmp_path / "final"))
    card = check_card(tmp_path / "final", "GRPO with replay buffer", "GRPOWithReplayBufferTrainer")
    assert card.data.datasets == ["trl-lib/DeepMath-103K"]
    assert {"replay-buffer", "grpo", "replayrl"} <= set(card.data.tags)
    assert "| `replay_buffer_size` | `8` |" in card.text and "| `replay_strategy` | `'group'` |" in card.text
    records = read_metrics(out / METRICS_FILE)
    for line in summary_lines(records):  # reward at the start and the end, the replay buffer's work
        assert f"- {line}\n" in card.text
    assert "- completions generated: 32\n" in card.text  # 4 steps of 8 completions
    assert (tmp_path / "final" / PLOT_FILE).is_file() and f"![Training curves]({PLOT_FILE})" in card.text


def test_ppo_train_writes_the_card(tokenizer, tmp_path):
    from tests.ppo.test_train import lowercase_fraction, trainer_for

    trainer = trainer_for(tokenizer, tmp_path / "ppo-run", steps=2)
    trainer.model.pretrained_model.config._name_or_path = BASE
    trainer.train([lowercase_fraction], generation_kwargs={"max_new_tokens": 4})
    card = check_card(tmp_path / "ppo-run", "PPO", "PPOTrainer")
    reward = [r["reward"] for r in read_metrics(tmp_path / "ppo-run" / METRICS_FILE)]
    assert f"- reward: {reward[0]:.3f} -> {reward[-1]:.3f}" in card.text


def test_ddpo_save_pretrained_writes_the_card(tmp_path):
    pytest.importorskip("diffusers")
    from accelerate.state import AcceleratorState

    from tests.ddpo.conftest import tiny_trainer

    AcceleratorState._reset_state(reset_partial_state=True)  # DDPO's Accelerator sets its own mixed precision
    trainer = tiny_trainer(tmp_path / "run")  # LoRA on the UNet
    trainer.sd_pipeline.sd_pipeline.register_to_config(_name_or_path="stable-diffusion-v1-5/stable-diffusion-v1-5")
    trainer.save_pretrained(tmp_path / "sd-model")
    card = check_card(tmp_path / "sd-model", "DDPO", "DDPOTrainer", base="stable-diffusion-v1-5/stable-diffusion-v1-5")
    assert card.data.library_name == "diffusers"
    assert 'from_pretrained("stable-diffusion-v1-5/stable-diffusion-v1-5")' in card.text
    assert 'pipe.load_lora_weights("sd-model")' in card.text  # the folder holds the LoRA weights only


def test_unknown_trainer_name_and_no_paper():
    """SFT has no method paper (as in TRL): no BibTeX but replayrl's, no paper link."""
    from replayrl.model_card import CardInfo, render_card

    text = render_card(CardInfo("SFT", "SFTTrainer", "m"))
    assert "huggingface.co/papers" not in text and bibtex_entries(text) == [REPLAYRL_CITATION]
    assert torch.__version__ in text


def test_push_to_hub_uploads_a_folder_holding_the_card(tokenizer, tmp_path, monkeypatch):
    """transformers' `Trainer.push_to_hub` (the real method) calls `create_model_card`, then uploads `output_dir`.
    The Hub is out of reach: only the upload call is replaced, by one that records what the folder holds then."""
    import transformers.trainer

    uploads = []

    class Hub:
        def upload_folder(self, folder_path, **kwargs):
            folder = tmp_path / "out"
            assert folder_path == str(folder)
            uploads.append({p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()})
            return kwargs["repo_id"]

    monkeypatch.setattr(transformers.trainer, "hf_api", Hub)
    trainer = build("dpo", tokenizer, str(tmp_path / "out"), hub_model_id="me/tiny-dpo")
    trainer.hub_model_id = "me/tiny-dpo"  # the repo exists: init_hf_repo (create_repo on the Hub) is skipped
    trainer.train()
    assert trainer.push_to_hub(dataset_name="trl-lib/ultrafeedback_binarized") == "me/tiny-dpo"
    (files,) = uploads
    assert {CARD_FILE, PLOT_FILE, "model.safetensors", METRICS_FILE} <= set(files)
    card = ModelCard(files[CARD_FILE].decode())
    assert card.data.model_name == "tiny-dpo" and card.data.datasets == ["trl-lib/ultrafeedback_binarized"]
    assert 'model="me/tiny-dpo"' in card.text and "https://huggingface.co/papers/2305.18290" in card.text
