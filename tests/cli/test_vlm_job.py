"""`replayrl grpo --vlm`: the built-in vision-language job's settings and data (the run itself: docs/vlm.md)."""

import pytest

from replayrl.cli.common import CLIError
from replayrl.cli.grpo import parse_grpo_args
from replayrl.tasks import vlm_colours
from replayrl.tasks.shapes import COLOURS, shape_dataset, shape_reward


def test_vlm_flag_selects_the_vlm_jobs_settings_and_flags_still_win():
    script, _, config = parse_grpo_args(["--vlm", "--max_steps", "7"])
    assert script.vlm and config.max_steps == 7
    assert config.learning_rate == vlm_colours.DEFAULT_CONFIG["learning_rate"]
    assert config.max_completion_length == 2 and config.max_prompt_length is None
    script, _, config = parse_grpo_args(["--vlm", "false"])
    assert not script.vlm and config.max_completion_length != 2  # the addition job's settings
    with pytest.raises(CLIError, match="--vlm runs the built-in vision-language job"):
        parse_grpo_args(["--vlm", "--dataset_name", "data.jsonl"])


def test_shape_images_show_their_answer_and_the_reward_reads_the_first_letter():
    data = shape_dataset(12, size=28, seed=3)
    for row in data:
        pixels = set(row["image"].getdata())
        assert COLOURS[row["answer"]] in pixels  # the shape is drawn in the answer's colour
        assert not {COLOURS[c] for c in COLOURS if c != row["answer"]} & pixels
    assert shape_reward([" r.", "G", [{"role": "assistant", "content": "B"}], ""], ["R", "B", "B", "R"]) == [
        1.0,
        0.0,
        1.0,
        0.0,
    ]
    train, held_out = vlm_colours.task_datasets(0)
    assert len(train) == vlm_colours.TRAIN_IMAGES and len(held_out) == vlm_colours.HELD_OUT_IMAGES
