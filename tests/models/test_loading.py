"""The one loading path: a model given by name or path loads in float32 unless model_init_kwargs name a dtype (TRL
1.16's default), so a bf16 checkpoint's small updates are kept; an explicit dtype is respected; an object keeps
its dtype."""

import pytest
import torch
from datasets import Dataset

from replayrl.dpo import DPOConfig, DPOTrainer
from replayrl.models.loading import load_model, resolve_init_kwargs
from replayrl.models.tiny import build_tiny_model, save_tiny
from replayrl.reward import RewardConfig, RewardTrainer
from replayrl.rewards.functions import RewardFunctions
from replayrl.sft import SFTConfig, SFTTrainer
from replayrl.tasks.preferences import preference_datasets
from tests.conftest import QUIET_CPU_RUN, tiny_args

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
COMMON = dict(learning_rate=2e-5, max_steps=3, per_device_train_batch_size=2, **QUIET_CPU_RUN)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    """A tiny Qwen2 saved in bfloat16, as most published checkpoints are."""
    return save_tiny(tmp_path_factory.mktemp("tiny-bf16"), dtype=torch.bfloat16, **SMALL)


@pytest.fixture(scope="module")
def texts():
    return Dataset.from_dict({"text": [f"Add: {a}+{a + 3}={2 * a + 3}" for a in range(12)]})


@pytest.fixture(scope="module")
def pairs():
    return preference_datasets(seed=0, per_problem=1, rejected="near_miss")[0].select(range(12))


def _params(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _unchanged(before: dict[str, torch.Tensor], model) -> list[str]:
    """Parameters that training left bit-identical."""
    after = dict(model.named_parameters())
    return [n for n, p in before.items() if torch.equal(p, after[n].detach())]


def _sft(path, tmp_path, texts, bf16=False, **init) -> SFTTrainer:
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"), max_length=32, model_init_kwargs=init or None, bf16=bf16, **COMMON
    )
    return SFTTrainer(path, args=args, train_dataset=texts)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_sft_loads_a_bf16_checkpoint_in_float32_and_keeps_small_updates(bf16_dir, texts, tmp_path, bf16):
    """Also under bf16=True (TRL's mixed precision): autocast runs the matmuls in bf16, the weights stay float32."""
    trainer = _sft(bf16_dir, tmp_path, texts, bf16=bf16)
    assert trainer.accelerator.mixed_precision == ("bf16" if bf16 else "no")
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    before = _params(trainer.model)
    norms = [n for n in before if "norm" in n]
    assert len(norms) == 3  # input, post-attention and final norm: the weights bf16 rounds back to 1.0
    trainer.train()
    assert _unchanged(before, trainer.model) == []  # the norms too: lr 2e-5 is far below bf16's step at 1.0


def test_sft_auto_dtype_trains_the_checkpoints_bf16_weights_and_loses_the_norm_updates(bf16_dir, texts, tmp_path):
    """What the float32 default prevents: with the checkpoint's own dtype, 3 steps at lr 2e-5 round away."""
    trainer = _sft(bf16_dir, tmp_path, texts, dtype="auto")
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    before = _params(trainer.model)
    trainer.train()
    assert set(_unchanged(before, trainer.model)) >= {n for n in before if "norm" in n}


@pytest.mark.parametrize("dtype", ["bfloat16", torch.bfloat16, "float16"])
def test_sft_explicit_dtype_is_respected(bf16_dir, texts, tmp_path, dtype):
    trainer = _sft(bf16_dir, tmp_path, texts, dtype=dtype)
    expected = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    assert {p.dtype for p in trainer.model.parameters()} == {expected}


def test_sft_model_object_keeps_its_dtype(tokenizer, texts, tmp_path):
    model = build_tiny_model(tokenizer, dtype=torch.bfloat16, **SMALL)
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_length=32, **COMMON)
    trainer = SFTTrainer(model, args=args, train_dataset=texts, processing_class=tokenizer)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}


def _dpo(path, tmp_path, pairs, ref_model=None, **init) -> DPOTrainer:
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), model_init_kwargs=init or None, **COMMON)
    return DPOTrainer(path, ref_model=ref_model, args=args, train_dataset=pairs)


def test_dpo_loads_a_bf16_checkpoint_in_float32_and_keeps_small_updates(bf16_dir, pairs, tmp_path):
    trainer = _dpo(bf16_dir, tmp_path, pairs)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.float32}
    before = _params(trainer.model)
    trainer.train()
    assert _unchanged(before, trainer.model) == []


def test_dpo_explicit_dtype_reaches_policy_and_a_reference_given_by_path(bf16_dir, pairs, tmp_path):
    trainer = _dpo(bf16_dir, tmp_path, pairs, dtype="bfloat16")
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.bfloat16}  # the frozen copy
    # A reference given by path loads like the policy (TRL builds its reference with the policy's dtype) ...
    trainer = _dpo(bf16_dir, tmp_path, pairs, ref_model=bf16_dir)
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.float32}
    # ... unless ref_model_init_kwargs say otherwise.
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), ref_model_init_kwargs={"dtype": "auto"}, **COMMON)
    trainer = DPOTrainer(bf16_dir, ref_model=bf16_dir, args=args, train_dataset=pairs)
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.bfloat16}


def test_reward_model_by_path_loads_in_float32_unless_told(tmp_path, tokenizer, pairs):
    from replayrl.models.tiny import build_tiny_sequence_classifier

    path = tmp_path / "rm"
    build_tiny_sequence_classifier(tokenizer, **SMALL).to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    args = RewardConfig(output_dir=str(tmp_path / "rw"), **COMMON)
    assert RewardTrainer(str(path), args=args, train_dataset=pairs).model.dtype == torch.float32
    args = RewardConfig(output_dir=str(tmp_path / "rw"), model_init_kwargs={"dtype": "auto"}, **COMMON)
    assert RewardTrainer(str(path), args=args, train_dataset=pairs).model.dtype == torch.bfloat16
    # The reward models of GRPO / PPO reward functions, given by path, follow the same rule.
    assert RewardFunctions([str(path)]).funcs[0].dtype == torch.float32
    assert RewardFunctions([str(path)], model_init_kwargs={"dtype": "auto"}).funcs[0].dtype == torch.bfloat16


def test_value_head_model_by_path_loads_in_float32(bf16_dir):
    from replayrl.models.value_head import AutoModelForCausalLMWithValueHead

    model = AutoModelForCausalLMWithValueHead.from_pretrained(bf16_dir)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    model = AutoModelForCausalLMWithValueHead.from_pretrained(bf16_dir, dtype="bfloat16")
    assert model.pretrained_model.dtype == torch.bfloat16


def test_init_kwargs_dtype_rules():
    assert resolve_init_kwargs(None) == {"dtype": torch.float32}
    assert resolve_init_kwargs({"dtype": "auto", "revision": "x"}) == {"dtype": "auto", "revision": "x"}
    assert resolve_init_kwargs({"torch_dtype": "float16"}) == {"dtype": torch.float16}
    with pytest.raises(ValueError, match=r"model_init_kwargs\['dtype'\] = 'bf16'.*'bfloat16'"):
        resolve_init_kwargs({"dtype": "bf16"})
    with pytest.raises(ValueError, match="both dtype and torch_dtype"):
        resolve_init_kwargs({"dtype": "float32", "torch_dtype": "float32"})


def test_init_kwargs_with_a_model_object_are_refused(tokenizer):
    model = build_tiny_model(tokenizer, **SMALL)
    with pytest.raises(ValueError, match="ref_model_init_kwargs only apply when `ref_model` is a name or path"):
        load_model(model, {"dtype": "float32"}, role="ref_model", kwargs_name="ref_model_init_kwargs")
    assert load_model(model) is model


def _lengths(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_grpo_loads_a_bf16_checkpoint_in_float32_and_keeps_small_updates(bf16_dir, tmp_path):
    from replayrl.grpo import GRPOConfig, GRPOTrainer
    from replayrl.models.tiny import prompt_dataset

    args = tiny_args(GRPOConfig, tmp_path, learning_rate=2e-5, max_steps=3)
    trainer = GRPOTrainer(bf16_dir, reward_funcs=_lengths, args=args, train_dataset=prompt_dataset(16))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    before = _params(trainer.model)
    trainer.train()
    assert _unchanged(before, trainer.model) == []
    args = tiny_args(GRPOConfig, tmp_path, model_init_kwargs={"dtype": "bfloat16"})
    trainer = GRPOTrainer(bf16_dir, reward_funcs=_lengths, args=args, train_dataset=prompt_dataset(16))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}


def _dtypes(model) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


def test_kto_policy_and_reference_by_path_load_in_float32_unless_told(bf16_dir, pairs, tmp_path):
    from replayrl import KTOConfig, KTOTrainer

    def kto(**init):
        args = KTOConfig(output_dir=str(tmp_path / "kto"), model_init_kwargs=init or None, **COMMON)
        return KTOTrainer(bf16_dir, ref_model=bf16_dir, args=args, train_dataset=pairs)

    trainer = kto()
    assert _dtypes(trainer.model) == _dtypes(trainer.ref_model) == {torch.float32}
    trainer = kto(dtype="bfloat16")
    assert _dtypes(trainer.model) == _dtypes(trainer.ref_model) == {torch.bfloat16}


def test_distillation_student_and_teacher_by_path_load_in_float32_unless_told(bf16_dir, tmp_path):
    from replayrl import DistillationConfig, DistillationTrainer
    from replayrl.models.tiny import prompt_dataset

    def distill(**kwargs):
        args = DistillationConfig(output_dir=str(tmp_path / "kd"), max_completion_length=4, **kwargs, **COMMON)
        return DistillationTrainer(bf16_dir, bf16_dir, args=args, train_dataset=prompt_dataset(8))

    trainer = distill()
    assert _dtypes(trainer.model) == _dtypes(trainer.teacher_model) == {torch.float32}
    trainer = distill(model_init_kwargs={"dtype": "bfloat16"}, teacher_model_init_kwargs={"dtype": "bfloat16"})
    assert _dtypes(trainer.model) == _dtypes(trainer.teacher_model) == {torch.bfloat16}


def test_rloo_loads_a_bf16_checkpoint_in_float32(bf16_dir, tmp_path):
    from replayrl import RLOOConfig, RLOOTrainer
    from replayrl.models.tiny import prompt_dataset

    args = tiny_args(RLOOConfig, tmp_path)
    assert _dtypes(RLOOTrainer(bf16_dir, _lengths, args=args, train_dataset=prompt_dataset(16)).model) == {
        torch.float32
    }
