"""A causal LM with a scalar value head (TRL v0.7.1's `AutoModelForCausalLMWithValueHead`) and reference models.

The head is dropout + ``Linear(hidden_size, 1)`` on the last hidden state, one value per position. On disk the
head's weights sit in the model's own safetensors state dict under ``v_head.*``; a plain ``AutoModelForCausalLM``
loading the same folder ignores them (transformers reports them as unexpected keys). With PEFT (LoRA on the
policy) ``save_pretrained`` writes the adapter plus ``value_head.safetensors``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedModel

from replayrl.models.loading import apply_peft, load_model

HEAD_PREFIX = "v_head."
PEFT_HEAD_FILE = "value_head.safetensors"
_HEAD_KWARGS = ("summary_dropout_prob", "v_head_init_strategy", "v_head_initializer_range")


class ValueHead(nn.Module):
    """Dropout then ``Linear(hidden_size, 1)``: ``(B, T, H)`` -> ``(B, T)`` in float32."""

    def __init__(self, hidden_size: int, summary_dropout_prob: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(summary_dropout_prob) if summary_dropout_prob else nn.Identity()
        self.summary = nn.Linear(hidden_size, 1)

    def forward(self, hidden_states: Tensor) -> Tensor:
        output = self.dropout(hidden_states)
        return self.summary(output.to(self.summary.weight.dtype)).squeeze(-1).float()


def _hidden_size(config) -> int:
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("hidden_size", "word_embed_proj_dim", "d_model", "n_embd"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"cannot find the hidden size in {type(config).__name__}; expected `hidden_size` or similar")


class AutoModelForCausalLMWithValueHead(nn.Module):
    """``pretrained_model`` (a causal LM, or a PEFT model around one) plus ``v_head``.

    ``forward`` returns ``(lm_logits (B, T, V) float32, loss or None, value (B, T))`` like TRL v0.7.1's;
    ``generate`` is the language model's.
    """

    supports_gradient_checkpointing = True
    _hidden_states_field = "hidden_states"  # the output field whose last entry the head reads
    # TRL v0.7.1's class attributes: the transformers class a saved folder loads back with (the head ignored), and
    # the names under which a language model keeps its LM head (a model with none of them is refused).
    transformers_parent_class = AutoModelForCausalLM
    lm_head_namings = ["lm_head", "embed_out"]
    _kind = "causal language model (AutoModelForCausalLM)"

    @staticmethod
    def _load_base(name_or_path: str, kwargs: dict | None) -> PreTrainedModel:
        return load_model(name_or_path, kwargs)

    def __init__(
        self,
        pretrained_model: PreTrainedModel,
        summary_dropout_prob: float | None = None,
        v_head_init_strategy: str | None = None,
        v_head_initializer_range: float = 0.2,
    ):
        super().__init__()
        self._check_lm_head(pretrained_model)
        self.pretrained_model = pretrained_model
        self.is_peft_model = hasattr(pretrained_model, "peft_config") and hasattr(pretrained_model, "disable_adapter")
        config = self.config
        if summary_dropout_prob is None:
            summary_dropout_prob = getattr(config, "summary_dropout_prob", 0.1)
        self.v_head = ValueHead(_hidden_size(config), summary_dropout_prob)
        if v_head_init_strategy == "normal":
            self.v_head.summary.weight.data.normal_(mean=0.0, std=v_head_initializer_range)
            self.v_head.summary.bias.data.zero_()
        elif v_head_init_strategy is not None:
            raise ValueError(f"unknown v_head_init_strategy {v_head_init_strategy!r}; use None or 'normal'")
        self.v_head.to(next(pretrained_model.parameters()).device)

    @classmethod
    def _check_lm_head(cls, model) -> None:
        """TRL v0.7.1's check: the wrapped model (or the model inside a PEFT wrapper) has an LM head."""
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        if not cls._has_lm_head(inner):
            raise ValueError(
                f"{type(inner).__name__} has no language-model head (none of {cls.lm_head_namings}); "
                f"{cls.__name__} needs a {cls._kind}: load it with {cls.transformers_parent_class.__name__}."
            )

    @classmethod
    def _has_lm_head(cls, model) -> bool:
        return any(hasattr(model, name) for name in cls.lm_head_namings)

    # ------------------------------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, peft_config=None, reward_adapter=None, **kwargs):
        """From a name/path (``v_head.*`` weights loaded when the folder has them) or a model object.

        Head kwargs: ``summary_dropout_prob``, ``v_head_init_strategy`` (None or "normal"),
        ``v_head_initializer_range``; the rest go to ``AutoModelForCausalLM.from_pretrained``. ``peft_config``
        wraps the language model with ``peft.get_peft_model`` (LoRA on the policy; the head stays trainable).
        ``reward_adapter``: the folder of a PEFT reward model on the same base (`compute_reward_score`).
        """
        head_kwargs = {k: kwargs.pop(k) for k in _HEAD_KWARGS if k in kwargs}
        if isinstance(pretrained_model_name_or_path, cls):
            return pretrained_model_name_or_path
        is_path = isinstance(pretrained_model_name_or_path, (str, Path))
        if is_path and (Path(pretrained_model_name_or_path) / "adapter_config.json").is_file():
            base = _load_peft(Path(pretrained_model_name_or_path), kwargs, cls._load_base)
        elif is_path:
            base = cls._load_base(str(pretrained_model_name_or_path), kwargs or None)
        else:
            base = pretrained_model_name_or_path
        base = apply_peft(base, peft_config)
        model = cls(base, **head_kwargs)
        if is_path:
            state = _read_head_state(Path(pretrained_model_name_or_path))
            if state:
                model.v_head.load_state_dict(state)
        if reward_adapter is not None:
            from replayrl.models.reward_adapter import load_reward_adapter

            load_reward_adapter(model, reward_adapter)
        return model

    def compute_reward_score(self, input_ids, attention_mask=None, ppo_adapter_name: str = "default", **kwargs):
        """TRL v0.7.1: the reward adapter's scores ``(B, T, num_labels)`` at every position, without gradients
        (`replayrl.models.reward_adapter`); the policy's adapter is active again after."""
        from replayrl.models.reward_adapter import reward_scores

        return reward_scores(self, input_ids, attention_mask, ppo_adapter_name, **kwargs)

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """The language model's folder with the head added under ``v_head.*`` (PEFT: adapter + head file).
        A ``state_dict`` in `state_dict`'s layout (e.g. whole tensors gathered from ZeRO-3 partitions) is written
        instead of the model's own, its ``v_head.*`` entries as the head."""
        from safetensors.torch import save_file

        given = kwargs.pop("state_dict", None)
        state_dict = self.state_dict() if given is None else given
        head = {k: v.detach().contiguous().cpu() for k, v in state_dict.items() if k.startswith(HEAD_PREFIX)}
        base = {k: v for k, v in state_dict.items() if not k.startswith(HEAD_PREFIX)}
        if self.is_peft_model:  # PEFT picks the adapter's entries out of a given state dict
            self.pretrained_model.save_pretrained(
                save_directory, **kwargs, **({} if given is None else {"state_dict": base})
            )
            save_file(head, str(Path(save_directory) / PEFT_HEAD_FILE), metadata={"format": "pt"})
            return
        self.pretrained_model.save_pretrained(save_directory, state_dict={**base, **head}, **kwargs)

    # ------------------------------------------------------------------------------------------ model API
    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """TRL v0.7.1's layout: the language model's own keys plus ``v_head.*`` (what `save_pretrained` writes and
        a plain transformers model reads). Inside a parent module's state dict the keys stay ``pretrained_model.*``
        (what `nn.Module` nesting expects); `load_state_dict` takes either layout."""
        if args or destination is not None or prefix:
            return super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        state = self.pretrained_model.state_dict(keep_vars=keep_vars)
        state.update({HEAD_PREFIX + k: v for k, v in self.v_head.state_dict(keep_vars=keep_vars).items()})
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if not any(key.startswith("pretrained_model.") for key in state_dict):  # v0.7.1's layout (`state_dict`)
            state_dict = {k if k.startswith(HEAD_PREFIX) else "pretrained_model." + k: v for k, v in state_dict.items()}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def config(self):
        return self.pretrained_model.config

    def get_parameter_or_buffer(self, target: str) -> torch.Tensor:
        """transformers' lookup, by a key of `state_dict` (TRL v0.7.1's layout: the language model's keys and
        ``v_head.*``): accelerate's FSDP2 preparation looks the model's tensors up this way."""
        head = target.startswith(HEAD_PREFIX)
        module, name = (self.v_head, target.removeprefix(HEAD_PREFIX)) if head else (self.pretrained_model, target)
        owner, _, leaf = name.rpartition(".")
        return getattr(module.get_submodule(owner), leaf)

    @property
    def _no_split_modules(self):
        """The language model's decoder-layer classes: FSDP's transformer auto-wrap shards one unit per layer."""
        return getattr(self.pretrained_model, "_no_split_modules", None)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def generation_config(self):
        return self.pretrained_model.generation_config

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, return_past_key_values=False, **kw):
        kw["output_hidden_states"] = True
        out = self.pretrained_model(
            input_ids=input_ids, past_key_values=past_key_values, attention_mask=attention_mask, **kw
        )
        value = self.v_head(getattr(out, self._hidden_states_field)[-1])
        lm_logits = out.logits.float()
        if return_past_key_values:
            return lm_logits, out.loss, value, out.past_key_values
        return lm_logits, out.loss, value

    def generate(self, *args, **kwargs):
        return self.pretrained_model.generate(*args, **kwargs)

    def tie_weights(self, *args, **kwargs):
        """The language model's: accelerate's FSDP2 preparation re-ties tied embeddings after moving the model to
        the meta device and after loading the sharded weights (without it the head becomes a separate copy)."""
        return self.pretrained_model.tie_weights(*args, **kwargs)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.pretrained_model.gradient_checkpointing_enable(**kwargs)

    def post_init(self, state_dict: dict) -> None:
        """TRL v0.7.1's hook: load ``v_head.*`` entries of ``state_dict`` into the head."""
        head = {k.removeprefix(HEAD_PREFIX): v for k, v in state_dict.items() if k.startswith(HEAD_PREFIX)}
        self.v_head.load_state_dict(head)


class AutoModelForSeq2SeqLMWithValueHead(AutoModelForCausalLMWithValueHead):
    """TRL v0.7.1's value head for encoder-decoder models (T5, BART, ...): ``pretrained_model`` is a
    ``AutoModelForSeq2SeqLM`` and the head reads the decoder's last hidden state, one value per decoder position.

    ``forward(input_ids, attention_mask, decoder_input_ids=..., ...)`` returns ``(lm_logits (B, T_dec, V) float32,
    loss or None, value (B, T_dec))``; saving, loading (``v_head.*``) and PEFT as the causal class.
    """

    _hidden_states_field = "decoder_hidden_states"
    transformers_parent_class = AutoModelForSeq2SeqLM
    lm_head_namings = ["lm_head", "embed_out", "output_projection"]
    _kind = "sequence-to-sequence language model (AutoModelForSeq2SeqLM)"
    is_encoder_decoder = True

    @classmethod
    def _has_lm_head(cls, model) -> bool:
        """TRL v0.7.1's rule for encoder-decoders: a module named after a head anywhere (FSMT's sits in the
        decoder: ``model.decoder.output_projection``)."""
        return any(any(n in name for n in cls.lm_head_namings) for name, _ in model.named_modules())

    @staticmethod
    def _load_base(name_or_path: str, kwargs: dict | None) -> PreTrainedModel:
        return load_model(name_or_path, kwargs, architecture="seq2seq_lm")


def _load_peft(folder: Path, kwargs: dict, load_base=load_model):
    """A PEFT adapter folder (written by `save_pretrained` of a PEFT value-head model): base model + adapter,
    trainable."""
    try:
        from peft import PeftConfig, PeftModel
    except ImportError as err:
        raise ImportError(f"{folder} holds a PEFT adapter; loading it needs peft: pip install replayrl[peft]") from err
    base = load_base(PeftConfig.from_pretrained(str(folder)).base_model_name_or_path, kwargs or None)
    return PeftModel.from_pretrained(base, str(folder), is_trainable=True)


def _read_head_state(folder: Path) -> dict[str, Tensor]:
    """``v_head.*`` tensors from a folder's safetensors (single file, sharded, or the PEFT head file)."""
    from safetensors import safe_open

    if (folder / PEFT_HEAD_FILE).is_file():
        files = [folder / PEFT_HEAD_FILE]
    elif (folder / "model.safetensors.index.json").is_file():
        index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
        files = sorted({folder / f for k, f in index.items() if k.startswith(HEAD_PREFIX)})
    else:
        files = [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else []
    state = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith(HEAD_PREFIX):
                    state[key.removeprefix(HEAD_PREFIX)] = f.get_tensor(key)
    return state


def create_reference_model(model, num_shared_layers: int | None = None, pattern: str | None = None):
    """A frozen copy of ``model`` (value-head wrapper or plain LM) for the KL penalty, in eval mode.

    With ``num_shared_layers=k`` the embeddings and the first ``k`` transformer blocks are not copied: the
    reference uses the policy's own tensors, and those are frozen in the policy too (as TRL v0.7.1), which saves
    memory and compute. ``pattern`` is accepted for TRL v0.7.1's signature; layers are found as the model's
    largest ``nn.ModuleList``.
    """
    del pattern
    ref = copy.deepcopy(model)
    if num_shared_layers is not None:
        _share_layers(model, ref, num_shared_layers)
    for param in ref.parameters():
        param.requires_grad_(False)
    return ref.eval()


def _share_layers(model: nn.Module, ref: nn.Module, num_shared_layers: int) -> None:
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError("num_shared_layers: the model has no nn.ModuleList of transformer blocks to share")
    layers_name, layers = max(lists, key=lambda item: len(item[1]))
    if not 0 <= num_shared_layers <= len(layers):
        raise ValueError(f"num_shared_layers={num_shared_layers} but the model has {len(layers)} layers")
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None and hasattr(model, "pretrained_model"):
        embeddings = model.pretrained_model.get_input_embeddings()
    shared = [f"{layers_name}.{i}." for i in range(num_shared_layers)]
    embedding_ids = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    for name, param in model.named_parameters():
        if id(param) in embedding_ids or any(name.startswith(prefix) for prefix in shared):
            module_name, _, attr = name.rpartition(".")
            ref.get_submodule(module_name)._parameters[attr] = param
            param.requires_grad_(False)
