"""Checkpoints that never lose the replay buffer: a kill -9 at any moment of a save, then
`resume_from_checkpoint=True`, continues from the last complete checkpoint and logs what an uninterrupted run
logs; settings that change the state's meaning are checked on resume; old runs' checkpoints are not mixed in."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replayrl import GRPOWithReplayBufferConfig, GRPOWithReplayBufferTrainer
from replayrl.checkpoints import COMPLETE_MARKER, CheckpointError
from replayrl.models.tiny import build_tiny_model, build_tokenizer, prompt_dataset
from tests.conftest import tiny_args

ROOT = Path(__file__).resolve().parents[2]


def reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def run_replay(out, resume=None, **overrides):
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    settings = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        max_steps=6,
        replay_buffer_size=4,
        beta=0.1,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=1,
    )
    settings.update(overrides)
    args = tiny_args(GRPOWithReplayBufferConfig, Path(out), **settings)
    trainer = GRPOWithReplayBufferTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=prompt_dataset(16), processing_class=tokenizer
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def losses(trainer, after: int) -> list[tuple[int, float, float]]:
    return [(h["step"], h["loss"], h["kl"]) for h in trainer.state.log_history if "loss" in h and h["step"] > after]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return run_replay(tmp_path_factory.mktemp("full"))


@pytest.mark.slow
@pytest.mark.parametrize("kill_at, resumes_from", [("transformers_files", 2), ("extra_state", 2), ("marker", 4)])
def test_kill_during_a_save_then_resume_true_equals_the_uninterrupted_run(
    kill_at, resumes_from, uninterrupted, tmp_path
):
    env = {**os.environ, "KILL_AT": kill_at, "PYTHONPATH": str(ROOT)}
    worker = [sys.executable, "-m", "tests.replay.save_kill_worker", str(tmp_path)]
    done = subprocess.run(worker, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr[-3000:]  # it really died by SIGKILL, mid-save
    assert (tmp_path / f"checkpoint-{resumes_from}" / COMPLETE_MARKER).exists()  # rotation kept the complete one
    resumed = run_replay(tmp_path, resume=True)
    assert resumed.state.global_step == 6
    full = uninterrupted
    assert [s for s, *_ in losses(resumed, resumes_from)] == list(range(resumes_from + 1, 7))
    for (s, loss, kl), (_, loss_full, kl_full) in zip(losses(resumed, resumes_from), losses(full, resumes_from)):
        assert loss == pytest.approx(loss_full, rel=1e-4, abs=1e-6), s
        assert kl == pytest.approx(kl_full, rel=1e-4, abs=1e-6), s
    assert [g.uid for g in resumed.replay_buffer.groups] == [g.uid for g in full.replay_buffer.groups]


def test_resume_with_another_num_generations_is_refused(tmp_path):
    run_replay(tmp_path, max_steps=2)
    with pytest.raises(CheckpointError, match="num_generations: checkpoint 4, now 2"):
        run_replay(tmp_path, resume=True, max_steps=4, num_generations=2)


def test_resume_with_a_smaller_buffer_keeps_the_best_groups(tmp_path, caplog):
    first = run_replay(tmp_path, max_steps=4, replay_buffer_size=8)
    saved = sorted((g.score for g in first.replay_buffer.groups), reverse=True)
    assert len(saved) > 2
    resumed = run_replay(tmp_path, resume=True, max_steps=4, replay_buffer_size=2)
    assert resumed.replay_buffer.capacity == 2
    assert sorted((g.score for g in resumed.replay_buffer.groups), reverse=True) == saved[:2]
    assert "keeps its highest-scored groups" in caplog.text


def test_a_fresh_run_into_a_directory_with_checkpoints_is_refused_unless_overwrite(tmp_path):
    run_replay(tmp_path, max_steps=2)
    with pytest.raises(
        ValueError, match="already holds checkpoints.*resume_from_checkpoint=True.*overwrite_output_dir"
    ):
        run_replay(tmp_path, max_steps=2)
    trainer = run_replay(tmp_path, max_steps=2, overwrite_output_dir=True)
    assert trainer.state.global_step == 2
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-2"]


@pytest.mark.parametrize("damaged", ["model.safetensors", "optimizer.pt", "replayrl_state_rank0.safetensors"])
def test_a_damaged_file_is_an_error_on_resume_naming_it_and_the_fallback(damaged, tmp_path):
    """4 KiB of plausible floats over a file of the last checkpoint: neither safetensors nor torch would notice;
    the checksums recorded in the marker do, before anything is loaded."""
    from tests.test_checkpoints import overwrite_4k

    out = tmp_path / "run"
    run_replay(out, max_steps=4, save_total_limit=None)
    overwrite_4k(out / "checkpoint-4" / damaged)
    with pytest.raises(CheckpointError, match=rf"checkpoint-4 is damaged: {damaged}.*Resume from .*checkpoint-2"):
        run_replay(out, resume=True, max_steps=6)
    assert run_replay(out, resume=str(out / "checkpoint-2"), max_steps=6).state.global_step == 6
