"""`TrainingArguments`: transformers' own, plus what every replayrl trainer's config shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments as _HFTrainingArguments


@dataclass
class TrainingArguments(_HFTrainingArguments):
    """transformers' `TrainingArguments` plus `overwrite_output_dir` (dropped by transformers 5, which replayrl
    brings back because it refuses to start a fresh run in a directory holding an earlier run's checkpoints)."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start afresh in an output_dir that holds checkpoints, deleting them. Without it such a "
            "directory is refused unless resume_from_checkpoint is set."
        },
    )
