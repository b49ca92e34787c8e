"""examples/pipeline_sft_reward_grpo.py runs as written (SFT -> reward model -> GRPO with replay), with tiny
step counts."""

import runpy
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_pipeline_example_runs_end_to_end(tmp_path, capsys):
    example = Path(__file__).parents[1] / "examples" / "pipeline_sft_reward_grpo.py"
    argv = sys.argv
    sys.argv = [str(example), "--output_dir", str(tmp_path), "--sft_steps", "4", "--rm_steps", "4", "--grpo_steps", "2"]
    try:
        namespace = runpy.run_path(str(example), run_name="__main__")
    finally:
        sys.argv = argv
    for stage in ("sft", "rm", "grpo"):
        assert (tmp_path / stage / "config.json").is_file()
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    # the saved reward model was the reward GRPO optimised; exact match was logged with weight 0
    assert trainer.reward_funcs.weights.tolist() == [1.0, 0.0]
    logged = {k for r in trainer.state.log_history for k in r}
    assert namespace["rm_key"] in logged and "rewards/exact_match/mean" in logged
    assert "eval_rewards/exact_match/mean" in logged
    printed = capsys.readouterr().out
    assert "1. SFT" in printed and "2. reward model" in printed and "3. GRPO+replay" in printed
