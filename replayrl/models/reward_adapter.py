"""TRL v0.7.1's reward-modeling adapter on a PEFT value-head policy (`from_pretrained(..., reward_adapter=...)`).

A reward model trained with PEFT (a LoRA sequence classifier on the same base model) is loaded as a second,
frozen adapter of the policy's `PeftModel`, and its score head as ``model.score``; `compute_reward_score` switches
to that adapter, reads the score head over the last hidden states and switches back. One base model in memory
serves the policy, the reference (adapters disabled) and the reward model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

SCORE_MODULES = ("score",)  # TRL v0.7.1's `supported_rm_modules`: the head's name in the reward adapter's weights


def load_reward_adapter(model, adapter_path, adapter_name: str = "reward_model_adapter") -> None:
    """Add the PEFT reward adapter saved in ``adapter_path`` to ``model.pretrained_model`` (frozen, inactive) and
    its score head as ``model.score`` (frozen); ``model`` is a value-head wrapper around a `PeftModel`."""
    if not model.is_peft_model:
        raise ValueError(
            "reward_adapter needs a PEFT policy (TRL v0.7.1: 'reward_adapter can only be used with a PeftModel'): "
            "pass a PeftModel, or peft_config=LoraConfig(...), with reward_adapter."
        )
    folder = Path(adapter_path)
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(
            f"reward_adapter={str(adapter_path)!r} holds no adapter_config.json: pass the folder that a PEFT reward "
            "model's save_pretrained wrote (a LoRA sequence classifier on the policy's base model)."
        )
    from peft import LoraConfig, set_peft_model_state_dict
    from peft.utils import load_peft_weights

    state = load_peft_weights(str(folder), device="cpu")
    score = {k.rsplit(".", 1)[-1]: state.pop(k) for k in list(state) if any(m in k for m in SCORE_MODULES)}
    if "weight" not in score:
        raise ValueError(f"reward_adapter={str(adapter_path)!r} has no score head ({SCORE_MODULES}) in its weights.")
    config = LoraConfig.from_pretrained(str(folder))
    config.modules_to_save = None  # the score head is kept apart, as `model.score`
    peft_model = model.pretrained_model
    peft_model.add_adapter(adapter_name, config)
    set_peft_model_state_dict(peft_model, state, adapter_name=adapter_name)
    for name, param in peft_model.named_parameters():
        if f".{adapter_name}." in name:
            param.requires_grad_(False)
    num_labels, hidden = score["weight"].shape
    head = nn.Linear(hidden, num_labels, bias="bias" in score)
    head.load_state_dict(score)
    model.score = head.requires_grad_(False).to(model.device)
    model.rm_adapter_name = adapter_name


@torch.no_grad()
def reward_scores(model, input_ids: Tensor, attention_mask: Tensor | None, ppo_adapter_name: str, **kwargs) -> Tensor:
    """``(B, T, num_labels)`` scores of the reward adapter at every position (the reward is the last real
    token's); the policy's adapter ``ppo_adapter_name`` and the training mode are restored after."""
    if getattr(model, "rm_adapter_name", None) is None:
        raise ValueError("compute_reward_score needs a reward adapter: from_pretrained(..., reward_adapter=folder).")
    peft_model, was_training = model.pretrained_model, model.pretrained_model.training
    peft_model.set_adapter(model.rm_adapter_name)
    peft_model.eval()
    try:
        out = peft_model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **kwargs)
        hidden = out.hidden_states[-1]
        return model.score(hidden.to(model.score.weight.dtype))
    finally:
        peft_model.set_adapter(ppo_adapter_name)
        for name, param in peft_model.named_parameters():  # set_adapter made the reward adapter trainable
            if f".{model.rm_adapter_name}." in name:
                param.requires_grad_(False)
        peft_model.train(was_training)
