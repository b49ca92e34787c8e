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


def train(root: Path, trackers: str, **env_vars: str) -> Path:
    """Run tracker_worker.py in its own process (trackers read their folders from the environment at import)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **env_vars}
    env.update(PYTHONPATH=str(Path(__file__).parents[2]), HF_HUB_DISABLE_TELEMETRY="1")
    cmd = [sys.executable, str(WORKER), str(root / "out"), trackers]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return root / "out"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(metrics.jsonl records, trackio rows by step, TensorBoard scalars {tag: {step: value}}, TB texts {step: md})."""
    root = tmp_path_factory.mktemp("trackers")
    out = train(root, "trackio,tensorboard", TRACKIO_DIR=str(root / "trackio"))
    return (
        read_metrics(out / METRICS_FILE),
        trackio_rows(root / "trackio" / f"{PROJECT}.db"),
        *tensorboard_events(out / "runs"),
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


def tracker_tag(key: str) -> str:
    """transformers' `rewrite_logs`: eval_x -> eval/x, anything else -> train/x."""
    return key.replace("eval_", "eval/", 1) if key.startswith("eval_") else f"train/{key}"


def test_every_metric_reaches_trackio_and_tensorboard(run):
    records, trackio, scalars, _ = run
    checked = 0
    for record in records:
        step = record["step"]
        for key, value in record.items():
            if key == "step" or value is None:
                continue
            tag = tracker_tag(key)
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
    fresh = set()  # (prompt, completion, reward) of every fresh row so far: a replayed row is one of them
    for step, groups in sorted(replaced.items()):
        table = trackio[step]["completions"]
        assert table["_type"] == "trackio.table"
        rows = table["_value"]
        assert len(rows) == 8 + groups * G and list(rows[0]) == COLUMNS  # the default appends buffered groups
        assert sum(row["replayed"] for row in rows) == groups * G
        for row in rows:
            if row["replayed"]:  # stored text and reward; the buffer keeps no per-function rewards
                assert row["task_reward"] in (None, "NaN")
                assert (row["prompt"], row["completion"], row["reward"]) in fresh
            else:  # reward_weights [1, 0]: the reward is the task reward
                assert row["reward"] == pytest.approx(row["task_reward"])
                assert row["length_reward"] == pytest.approx(len(row["completion"]) / 10)
        fresh |= {(r["prompt"], r["completion"], r["reward"]) for r in rows if not r["replayed"]}
        tb_rows = parse_markdown(texts[step])
        assert list(tb_rows[0]) == COLUMNS
        assert [r["replayed"] == "True" for r in tb_rows] == [r["replayed"] for r in rows]
        for tb, tr in zip(tb_rows, rows):
            assert float(tb["advantage"]) == pytest.approx(tr["advantage"], rel=1e-3, abs=1e-3)
            assert math.isclose(float(tb["reward"]), tr["reward"], rel_tol=1e-3)


def wandb_records(run_file: Path) -> list:
    """The protobuf records of an offline run's `.wandb` file (a LevelDB-style log: a 7-byte header, then 32 KiB
    blocks of records, each with a 7-byte header: crc32, length, kind 1 full / 2 first / 3 middle / 4 last)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw, pos, pieces, out = run_file.read_bytes(), 7, b"", []
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        pieces, pos = pieces + raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            out.append(record)
            pieces = b""
    return out


def test_wandb_offline_gets_every_metric_and_the_table(tmp_path):
    pytest.importorskip("wandb")
    out = train(tmp_path, "wandb", WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    by_step, summary = defaultdict(dict), {}
    for record in wandb_records(next(run_dir.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            by_step[values["train/global_step"]].update(values)
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update})
    records = read_metrics(out / METRICS_FILE)
    for record in records:
        for key, value in record.items():
            if key != "step" and value is not None:  # the end-of-run summary goes to the run's summary (transformers)
                logged = by_step[record["step"]].get(tracker_tag(key), summary.get(tracker_tag(key), summary.get(key)))
                assert logged == pytest.approx(value, rel=1e-6), key
    for record in records:
        if "replay/groups_replaced" in record:
            table_file = by_step[record["step"]]["completions/path"]  # a wandb.Table is a JSON file of the run
            data = json.loads((run_dir / "files" / table_file).read_text())
            assert data["columns"] == COLUMNS and len(data["data"]) == 8 + record["replay/groups_replaced"] * G
            replayed = [row[COLUMNS.index("replayed")] for row in data["data"]]
            assert sum(replayed) == record["replay/groups_replaced"] * G


def test_distillation_completions_reach_tensorboard(tokenizer, tmp_path):
    """DistillationTrainer's `log_completions` (prompt and completion) in TensorBoard, in this process."""
    from replayrl import DistillationConfig, DistillationTrainer
    from replayrl.models.tiny import build_tiny_model, prompt_dataset

    size = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    args = DistillationConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=2, max_completion_length=6,
        logging_steps=1, save_strategy="no", report_to="tensorboard", log_completions=True, use_cpu=True, seed=0,
        disable_tqdm=True, bf16=False, gradient_checkpointing=False,
    )  # fmt: skip
    student, teacher = build_tiny_model(tokenizer, seed=0, **size), build_tiny_model(tokenizer, seed=1, **size)
    data = prompt_dataset(16)
    DistillationTrainer(student, teacher, args=args, train_dataset=data, processing_class=tokenizer).train()
    scalars, texts = tensorboard_events(tmp_path / "out" / "runs")
    assert sorted(texts) == [1, 2] and {1, 2} <= set(scalars["train/loss"])
    rows = parse_markdown(texts[1])
    assert len(rows) == 8 and list(rows[0]) == ["prompt", "completion"]
    assert {r["prompt"] for r in rows} <= set(data["prompt"])
