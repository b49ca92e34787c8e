"""TRL 1.16's DPOConfig fields that replayrl's DPO gained late: each one checked through `train()`."""

import copy
import warnings

import pytest
import torch
from datasets import Dataset

from replayrl.algos.preference import ld_token_weights, shared_completion_lengths
from replayrl.dpo import DPOConfig, DPOTrainer
from tests.dpo.test_trainer import LAYOUTS, dpo_args, first_batch, losses, run_layout, tiny
from tests.trl_fields.parity import mismatches
from tests.trl_fields.probes import offloading_seen, save_remote_code_model

# TRL 1.16 defaults replayrl keeps different on purpose, with where that is documented.
DELIBERATE = {
    "bf16": "docs/dpo.md and docs/deviations.md (Loading): transformers' False, so a CPU-first run trains in fp32",
    "gradient_checkpointing": "docs/dpo.md: transformers' default kept (CPU-first, tiny models)",
}
# completions of different lengths, so that each pair has a tail past its shared length
ROWS = [{"prompt": "x" * (1 + 3 * i), "chosen": "y" * (1 + i % 3), "rejected": "z" * (4 - i % 3)} for i in range(8)]


def test_every_trl_field_with_trl_defaults():
    assert mismatches(DPOConfig, "dpo", DELIBERATE) == []


def reference_ld_logps(model, batch, ld_alpha):
    """TRL 1.16's LD-DPO sequence log-probs from the full logits of each side's rows: token log-probs weighted 1
    up to the pair's shared completion length, ld_alpha beyond (its `_compute_loss`, written out)."""
    per_side = {}
    for side in ("chosen", "rejected"):
        ids, mask, labels = batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"], batch[f"{side}_labels"]
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1], -1)
        target = labels[:, 1:]
        completion = (target != -100).long()
        token = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * completion
        per_side[side] = (token, completion)
    (tc, mc), (tr, mr) = per_side["chosen"], per_side["rejected"]
    shared = torch.minimum(mc.sum(1), mr.sum(1))[:, None]
    out = []
    for token, completion in ((tc, mc), (tr, mr)):
        position = completion.cumsum(1) * completion
        weight = torch.where(position <= shared, 1.0, ld_alpha) * completion
        out.append((token * weight).sum(1))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ld_alpha_weights_the_tail_past_the_shared_length(tokenizer, tmp_path, layout):
    model = tiny(tokenizer)
    args = dpo_args(tmp_path, ld_alpha=0.25, per_device_train_batch_size=8, **LAYOUTS[layout])
    trainer = DPOTrainer(model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer)
    batch = first_batch(trainer)
    chosen, rejected, _, _ = trainer.concatenated_forward(model, batch)
    want_c, want_r = reference_ld_logps(model, batch, 0.25)
    assert torch.allclose(chosen, want_c, atol=1e-5) and torch.allclose(rejected, want_r, atol=1e-5)
    plain_c, plain_r = reference_ld_logps(model, batch, 1.0)
    assert (chosen - plain_c).abs().max() > 1e-2 or (rejected - plain_r).abs().max() > 1e-2  # tails exist


def test_ld_alpha_one_case_by_hand():
    """One pair, chosen 2 completion tokens, rejected 3, log-probs -1, -2 | -1, -2, -4: shared length 2, so with
    ld_alpha 0.5 the rejected sum is -1 - 2 + 0.5 * -4 = -5 and the chosen one stays -3."""
    logps = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -2.0, -4.0]])
    positions = torch.tensor([[1, 2, 0], [1, 2, 3]])
    shared = shared_completion_lengths(torch.tensor([2, 3]))
    sums = (logps * ld_token_weights(positions, shared[:, None], 0.5)).sum(1)
    assert sums.tolist() == [-3.0, -5.0]


def test_ld_alpha_same_loss_in_every_layout_and_one_is_plain_dpo(tokenizer, tmp_path):
    runs = {layout: run_layout(tokenizer, tmp_path / "ld", ROWS, "sdpa", layout, ld_alpha=0.3) for layout in LAYOUTS}
    base = [r["loss"] for r in runs["two_rows"][0]]
    for layout in ("shared", "packed"):
        assert [r["loss"] for r in runs[layout][0]] == pytest.approx(base, abs=1e-5), layout
    plain = [r["loss"] for r in run_layout(tokenizer, tmp_path / "plain", ROWS, "sdpa", "shared")[0]]
    one = [r["loss"] for r in run_layout(tokenizer, tmp_path / "one", ROWS, "sdpa", "shared", ld_alpha=1.0)[0]]
    assert one == pytest.approx(plain, abs=1e-6)
    assert abs(base[0] - plain[0]) > 1e-4


def test_ld_alpha_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"ld_alpha must be in \[0, 1\].*got 1.5"):
        DPOConfig(output_dir="x", ld_alpha=1.5)


@pytest.mark.parametrize("layout", ["two_rows", "shared"])
def test_pad_to_multiple_of_pads_the_trained_batch_and_keeps_the_loss(tokenizer, tmp_path, layout):
    plain, plain_weights, plain_shapes = run_layout(tokenizer, tmp_path / "plain", ROWS, "sdpa", layout)
    padded, weights, shapes = run_layout(tokenizer, tmp_path / "padded", ROWS, "sdpa", layout, pad_to_multiple_of=8)
    assert any(s[1] % 8 for s in plain_shapes) and all(s[1] % 8 == 0 for s in shapes)  # the model's input widths
    assert [r["loss"] for r in padded] == pytest.approx([r["loss"] for r in plain], abs=1e-5)
    for name, value in weights.items():
        if not name.endswith("k_proj.bias"):  # see assert_same_weights
            torch.testing.assert_close(value, plain_weights[name], atol=2e-5, rtol=1e-4)


def test_pad_to_multiple_of_auto_and_collated_widths(tokenizer, tmp_path):
    assert DPOConfig(output_dir="x").pad_to_multiple_of is None  # "auto": 128 on Neuron only
    args = dpo_args(tmp_path, pad_to_multiple_of="16")
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer)
    batch = first_batch(trainer)
    assert all(batch[f"{side}_{key}"].shape[1] % 16 == 0 for side in ("chosen", "rejected") for key in ("input_ids",
               "attention_mask", "labels"))  # fmt: skip


@pytest.mark.parametrize("layout", ["two_rows", "shared"])
def test_activation_offloading_gives_the_same_steps(tokenizer, tmp_path, layout):
    base, base_weights, _ = run_layout(tokenizer, tmp_path / "on-device", ROWS, "sdpa", layout)
    got, weights, _ = run_layout(tokenizer, tmp_path / "offloaded", ROWS, "sdpa", layout, activation_offloading=True)
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in base], abs=1e-6)
    for name, value in weights.items():
        torch.testing.assert_close(value, base_weights[name], atol=1e-6, rtol=1e-6)


def test_activation_offloading_wraps_the_training_forward_only(tokenizer, tmp_path):
    args = dpo_args(tmp_path, activation_offloading=True)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer)
    seen = offloading_seen(trainer)
    trainer.train()
    assert seen == [True]  # the policy's forward; the reference's runs without gradients


def test_trust_remote_code_reaches_policy_reference_and_tokenizer(tmp_path):
    path = save_remote_code_model(tmp_path / "remote")
    args = dpo_args(tmp_path, trust_remote_code=True)
    trainer = DPOTrainer(path, ref_model=path, args=args, train_dataset=Dataset.from_list(ROWS))
    assert (
        type(trainer.model).__name__ == "RemoteForCausalLM" and type(trainer.ref_model).__name__ == "RemoteForCausalLM"
    )
    trainer.train()
    with pytest.raises(ValueError, match="custom code"):
        DPOTrainer(path, args=dpo_args(tmp_path / "untrusted"), train_dataset=Dataset.from_list(ROWS))


def test_pad_token_is_applied_with_trls_deprecation_warning(tokenizer, tmp_path):
    tok = copy.deepcopy(tokenizer)  # the session's tokenizer keeps its pad token
    with pytest.warns(FutureWarning, match="`pad_token` is deprecated"):
        args = dpo_args(tmp_path, pad_token="<|im_end|>")
    trainer = DPOTrainer(tiny(tok), args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    assert trainer.processing_class.pad_token == "<|im_end|>"
    assert trainer.data_collator.pad_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        with pytest.warns(FutureWarning):
            DPOTrainer(tiny(tok), args=dpo_args(tmp_path, pad_token="<nope>"), train_dataset=Dataset.from_list(ROWS),
                       processing_class=tok)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        dpo_args(tmp_path)


@pytest.mark.parametrize("remove", [True, False])
def test_remove_unused_columns_keeps_what_the_trainer_reads(tokenizer, tmp_path, remove):
    rows = [{**row, "source": f"row {i}"} for i, row in enumerate(ROWS)]
    args = dpo_args(tmp_path, remove_unused_columns=remove, precompute_ref_log_probs=True)
    trainer = DPOTrainer(tiny(tokenizer), args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    kept = trainer._remove_unused_columns(trainer.train_dataset).column_names if remove else None
    if remove:
        assert sorted(kept) == sorted(["prompt_ids", "chosen_ids", "rejected_ids",
                                       "ref_chosen_logps", "ref_rejected_logps"])  # fmt: skip
    trainer.train()
    assert len(losses(trainer)) == 1


def test_f_divergence_only_with_the_losses_of_the_margin(tmp_path):
    """As TRL 1.16: an f-divergence other than reverse KL is refused with a loss that is not a function of the
    margin alone (it would be silently ignored there); the margin's losses take it."""
    with pytest.raises(ValueError, match=r"f_divergence_type='js_divergence'.*\['apo_zero'\]"):
        DPOConfig(output_dir=str(tmp_path), f_divergence_type="js_divergence", loss_type=["sigmoid", "apo_zero"])
    with pytest.raises(ValueError, match="f_divergence_type must be one of"):
        DPOConfig(output_dir=str(tmp_path), f_divergence_type="kl")
    config = DPOConfig(output_dir=str(tmp_path), f_divergence_type="alpha_divergence", loss_type=["ipo", "hinge"])
    assert config.loss_type == ["ipo", "hinge"]
