"""TRL 1.16 API points of SFT that TRL's own test file checks: plain TrainingArguments, and evaluate() on a raw
(unprepared) dataset or a dict of them."""

from transformers import TrainingArguments

from replayrl import SFTConfig, SFTTrainer
from replayrl.models.tiny import build_tiny_model, build_tokenizer
from tests.sft.helpers import addition_dataset, sft_args


def tiny(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)


def test_training_arguments_become_an_sft_config(tmp_path):
    tok = build_tokenizer()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, learning_rate=3e-3, report_to="none", use_cpu=True)
    trainer = SFTTrainer(tiny(tok), args=args, train_dataset=addition_dataset(8), processing_class=tok)
    assert isinstance(trainer.args, SFTConfig)
    assert (trainer.args.learning_rate, trainer.args.max_steps) == (3e-3, 1)
    assert trainer.args.max_length == SFTConfig(output_dir=str(tmp_path)).max_length  # SFT's own default


def test_evaluate_prepares_a_raw_dataset_or_a_dict_of_them(tmp_path):
    tok = build_tokenizer()
    trainer = SFTTrainer(tiny(tok), args=sft_args(tmp_path), train_dataset=addition_dataset(8), processing_class=tok)
    raw = addition_dataset(4)
    assert "input_ids" not in raw.column_names
    assert trainer.evaluate(eval_dataset=raw)["eval_loss"] > 0
    metrics = trainer.evaluate(eval_dataset={"a": raw, "b": addition_dataset(6)})
    assert metrics["eval_a_loss"] > 0 and metrics["eval_b_loss"] > 0
