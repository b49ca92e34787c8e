"""The MoE router auxiliary loss in DPO (TRL's `router_aux_loss_coef`), through train() on a tiny Qwen2-MoE; the
prefix-shared rows (a 4-D mask) give the aux loss of TRL's two rows per pair."""

import pytest

from replayrl import DPOTrainer
from tests.dpo.test_trainer import dpo_args, pairs_data  # noqa: F401 (pairs_data: a fixture)
from tests.sft.test_moe_aux import tiny_moe


def first_log(tokenizer, data, tmp_path, coef, **overrides):
    args = dpo_args(tmp_path, max_steps=1, router_aux_loss_coef=coef, **overrides)
    trainer = DPOTrainer(tiny_moe(tokenizer), args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    return trainer, trainer.state.log_history[0]


def test_aux_loss_is_added_and_layout_independent(tokenizer, pairs_data, tmp_path):  # noqa: F811
    data = pairs_data[0].select(range(8))
    trainer, shared = first_log(tokenizer, data, tmp_path / "shared", None)  # the config's coefficient, 0.02
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.02
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert trainer._shared_rows(trainer.model, batch) is not None  # the prefix-shared layout (4-D mask) ran
    _, rows = first_log(tokenizer, data, tmp_path / "rows", None, prefix_sharing=False)
    _, off = first_log(tokenizer, data, tmp_path / "off", 0.0, prefix_sharing=False)
    assert "aux_loss" not in off
    assert shared["aux_loss"] == pytest.approx(rows["aux_loss"], abs=1e-4)  # prompt tokens counted twice, as rows
    assert rows["loss"] - off["loss"] == pytest.approx(0.02 * rows["aux_loss"], abs=1e-5)
    assert shared["loss"] == pytest.approx(rows["loss"], abs=1e-4)
