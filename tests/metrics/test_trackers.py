"""Trackers checked for real: a GRPO-with-replay run with report_to=["trackio", "tensorboard"] and log_completions
stores every metric of its metrics.jsonl and the completions table in both, read back from trackio's local SQLite
store and TensorBoard's event files (no mock, no network: HF_HUB_OFFLINE, no Space, no server)."""

import json
import math
import os
import sqlite3
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from replayrl.metrics import METRICS_FILE, read_metrics
from tests.metrics.tracker_worker import PROJECT, RUN

pytest.importorskip("trackio")
pytest.importorskip("tensorboard")
WORKER = Path(__file__).with_name("tracker_worker.py")
COLUMNS = ["prompt", "completion", "reward", "advantage", "task_reward", "length_reward", "replayed"]
G = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(metrics.jsonl records, trackio rows by step, TensorBoard scalars {tag: {step: value}}, TB texts {step: md})."""
    root = tmp_path_factory.mktemp("trackers")
    env = {**os.environ, "TRACKIO_DIR": str(root / "trackio"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.update(PYTHONPATH=str(Path(__file__).parents[2]), HF_HUB_DISABLE_TELEMETRY="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(root / "out")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return (
        read_metrics(root / "out" / METRICS_FILE),
        trackio_rows(root / "trackio" / f"{PROJECT}.db"),
        *tensorboard_events(root / "out" / "runs"),
    )


def trackio_rows(db: Path) -> dict[int, dict]:
    """Every trackio row of the run, merged by the trainer's global step (`train/global_step`)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT metrics FROM metrics WHERE run_name = ?", (RUN,)).fetchall()
    by_step = defaultdict(dict)
    for (blob,) in rows:
        values = json.loads(blob)
        by_step[values["train/global_step"]].update(values)
    return by_step


def tensorboard_events(runs: Path) -> tuple[dict, dict]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (logdir,) = runs.iterdir()
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("completions/text_summary")}
    return scalars, texts


def parse_markdown(text: str) -> list[dict]:
    header, _, *lines = text.splitlines()
    names = [c.strip() for c in header.strip("|").split("|")]
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    return [dict(zip(names, row)) for row in cells]


def test_every_metric_reaches_trackio_and_tensorboard(run):
    records, trackio, scalars, _ = run
    checked = 0
    for record in records:
        step = record["step"]
        for key, value in record.items():
            if key == "step" or value is None:
                continue
            tag = key.replace("eval_", "eval/", 1) if key.startswith("eval_") else f"train/{key}"
            assert trackio[step][tag] == pytest.approx(value, rel=1e-6), (step, key)
            assert scalars[tag][step] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
            checked += 1
    keys = {k for r in records for k in r}
    assert {"reward", "replay/groups_replaced", "timing/generation", "rewards/length_reward/mean"} <= keys
    assert {"train_runtime", "train_loss"} <= keys  # the end-of-run summary, which TrackioCallback drops
    assert checked > 150


def test_completions_table_in_trackio_and_tensorboard(run):
    records, trackio, _, texts = run
    replaced = {r["step"]: r["replay/groups_replaced"] for r in records if "replay/groups_replaced" in r}
    assert sum(replaced.values()) > 0  # the run did replay groups
    for step, groups in replaced.items():
        table = trackio[step]["completions"]
        assert table["_type"] == "trackio.table"
        rows = table["_value"]
        assert len(rows) == 8 and list(rows[0]) == COLUMNS
        assert sum(row["replayed"] for row in rows) == groups * G
        for row in rows:
            if row["replayed"]:  # stored text and reward; the buffer keeps no per-function rewards
                assert row["task_reward"] in (None, "NaN") and row["completion"] is not None
            else:  # reward_weights [1, 0]: the reward is the task reward
                assert row["reward"] == pytest.approx(row["task_reward"])
                assert row["length_reward"] == pytest.approx(len(row["completion"]) / 10)
        tb_rows = parse_markdown(texts[step])
        assert list(tb_rows[0]) == COLUMNS
        assert [r["replayed"] == "True" for r in tb_rows] == [r["replayed"] for r in rows]
        for tb, tr in zip(tb_rows, rows):
            assert float(tb["advantage"]) == pytest.approx(tr["advantage"], rel=1e-3, abs=1e-3)
            assert math.isclose(float(tb["reward"]), tr["reward"], rel_tol=1e-3)
