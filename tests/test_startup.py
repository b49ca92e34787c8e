"""Instant start-up: `import replayrl`, `replayrl --help`, `replayrl plot` and argument errors import neither
torch nor transformers (nor peft); public names still resolve on first use."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "peft", "accelerate", "datasets")


def heavy_modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import replayrl",
        "import replayrl.experimental.grpo_with_replay_buffer",
        "from replayrl.cli import main; main(['--help'])",
        "from replayrl.cli import main; main(['--version'])",
        "from replayrl.cli import main; main(['trian'])",
        "from replayrl.cli import main; main([])",
        "import replayrl.metrics, replayrl.checkpoints",
    ],
)
def test_light_paths_import_nothing_heavy(code):
    assert heavy_modules_after(code) == []


def test_plot_draws_a_run_without_torch(tmp_path):
    rows = [{"step": s, "loss": 1.0 / s, "mean_token_accuracy": 0.1 * s} for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert heavy_modules_after(f"from replayrl.cli import main; assert main(['plot', {str(tmp_path)!r}]) == 0") == []
    assert (tmp_path / "training.png").stat().st_size > 5_000


def test_public_names_resolve_lazily():
    import replayrl
    from replayrl.experimental.grpo_with_replay_buffer import GRPOWithReplayBufferTrainer

    assert replayrl.GRPOWithReplayBufferTrainer is GRPOWithReplayBufferTrainer
    assert set(replayrl.__all__) <= set(dir(replayrl))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchTrainer'"):
        replayrl.NoSuchTrainer  # noqa: B018
