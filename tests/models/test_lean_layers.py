"""Lean RMSNorm / SwiGLU layers: the modules' own forward bit for bit, the same gradients, fewer saved bytes, and
every trainer's train() applies them unless memory_efficient_layers=False."""

import copy

import pytest
import torch
from datasets import Dataset

from replayrl import SFTConfig, SFTTrainer
from replayrl.models.lean_layers import make_layers_lean, make_layers_plain
from replayrl.models.tiny import build_tiny_model, build_tokenizer

# weights' dtype, autocast to bf16, gradient tolerance (relative to each gradient's largest entry), bound on the
# saved bytes against the modules' own (float32: the norm's float32 copy is its input, so there is less to drop)
CASES = {
    "float32": (torch.float32, False, 1e-5, 0.65),
    "bfloat16": (torch.bfloat16, False, 1e-2, 0.6),
    "float32-autocast-bf16": (torch.float32, True, 1e-5, 0.6),
}


def tiny(dtype=torch.float32):
    return build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=2, intermediate_size=128, seed=0).to(dtype)


def run(model, ids, autocast: bool):
    """Logits, parameter gradients and the bytes autograd kept for backward (parameters and repeats not counted)."""
    params = {p.data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            kept[t.data_ptr()] = max(kept.get(t.data_ptr(), 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}, sum(kept.values())


@pytest.mark.parametrize("case", list(CASES))
def test_same_forward_same_gradients_fewer_saved_bytes(case):
    dtype, autocast, tol, bound = CASES[case]
    plain = tiny(dtype)
    lean = copy.deepcopy(plain)
    assert make_layers_lean(lean) == 7  # 2 layers x (2 norms + MLP) + the final norm
    ids = torch.randint(3, 90, (2, 16), generator=torch.Generator().manual_seed(0))
    logits, grads, kept = run(plain, ids, autocast)
    lean_logits, lean_grads, lean_kept = run(lean, ids, autocast)
    assert torch.equal(lean_logits, logits)
    for name, grad in grads.items():
        scale = grad.abs().max().clamp(min=1e-12)
        assert (lean_grads[name] - grad).abs().max() <= tol * scale, name
    assert lean_kept < bound * kept, (lean_kept, kept)


def test_plain_again_and_no_gradient_path():
    model = tiny()
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    assert make_layers_lean(model) == 7 and make_layers_lean(model) == 7  # idempotent
    with torch.no_grad():  # generation and reference models: the modules' own forward
        assert torch.equal(model(input_ids=ids).logits, want)
    assert make_layers_plain(model) == 7
    assert not any("forward" in vars(m) for m in model.modules())


def test_only_what_is_provably_the_same_is_patched():
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, pad_token_id=0,
    )  # fmt: skip
    assert make_layers_lean(Gemma2ForCausalLM(config)) == 0  # its norm scales by 1 + weight
    peft = get_peft_model(tiny(), LoraConfig(r=4, target_modules=["gate_proj", "q_proj"]))
    assert make_layers_lean(peft) == 5  # the norms; the MLPs hold a LoRA-wrapped gate_proj


def sft_run(tmp_path, lean: bool):
    tok = build_tokenizer()
    model = tiny()
    rows = [{"text": f"the sum of {i} and {i + 1} is {2 * i + 1}"} for i in range(16)]
    args = SFTConfig(
        output_dir=str(tmp_path / str(lean)), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0,
        memory_efficient_layers=lean,
    )  # fmt: skip
    trainer = SFTTrainer(model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return model, losses


def test_train_applies_them_and_trains_the_same(tmp_path):
    lean_model, lean_losses = sft_run(tmp_path, lean=True)
    plain_model, plain_losses = sft_run(tmp_path, lean=False)
    assert sum(getattr(m, "_replayrl_lean", False) for m in lean_model.modules()) == 7
    assert not any(getattr(m, "_replayrl_lean", False) for m in plain_model.modules())
    assert lean_losses == pytest.approx(plain_losses, rel=1e-5)
    for (name, a), b in zip(lean_model.named_parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
