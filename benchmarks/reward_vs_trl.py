"""replayrl's RewardTrainer against TRL's: seconds per optimizer step (wall and CPU), setup seconds and peak RSS.

    python benchmarks/reward_vs_trl.py [--rounds 3] [--steps 12] [--trl_python PATH]

The harness is `dpo_vs_trl.py --trainer reward` (same preference pairs, same alternating fresh-process runs, same
median-of-medians; see its docstring): both sides load the same saved tiny Qwen2 sequence classifier (hidden
256, 4 layers, num_labels=1, pad_token_id set), batch 8, max_length 256, fp32, no gradient checkpointing, one
torch thread. Ratio = replayrl / TRL (< 1: replayrl faster / smaller).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dpo_vs_trl import main  # noqa: E402

if __name__ == "__main__":
    main(["--trainer", "reward", *sys.argv[1:]])
