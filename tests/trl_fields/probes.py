"""Probes for the TRL fields' tests: a checkpoint that ships its own code (`trust_remote_code`), and what is
active around the training forward (`activation_offloading`)."""

import json
from pathlib import Path

import torch

from replayrl.models.tiny import save_tiny

CODE = """
from transformers import AutoModel, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2Model


class RemoteConfig(Qwen2Config):
    model_type = "replayrl_remote"


class RemoteModel(Qwen2Model):
    config_class = RemoteConfig


AutoModel.register(RemoteConfig, RemoteModel, exist_ok=True)  # the classifier builds its body with AutoModel


class RemoteForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteConfig


class RemoteForSequenceClassification(Qwen2ForSequenceClassification):
    config_class = RemoteConfig
"""


def save_remote_code_model(path: Path) -> str:
    """`save_tiny` at `path`, its config rewritten to a model type transformers does not know, served by
    `remote.py` next to it (RemoteForCausalLM / RemoteForSequenceClassification)."""
    save_tiny(path, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    (path / "remote.py").write_text(CODE)
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = "replayrl_remote"
    config["auto_map"] = {
        "AutoConfig": "remote.RemoteConfig",
        "AutoModel": "remote.RemoteModel",
        "AutoModelForCausalLM": "remote.RemoteForCausalLM",
        "AutoModelForSequenceClassification": "remote.RemoteForSequenceClassification",
    }
    config_file.write_text(json.dumps(config))
    return str(path)


def offloading_seen(trainer) -> list[bool]:
    """Per training forward of the model: whether torch's save_on_cpu hooks are the active saved-tensor hooks
    (on a CPU machine its copies are no-ops, so the hooks themselves are what can be observed)."""
    seen = []

    def probe(module, inputs, output):
        if torch.is_grad_enabled():
            hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
            seen.append(hooks is not None and "save_on_cpu" in hooks[0].__qualname__)

    trainer.model.register_forward_hook(probe)
    return seen
