"""Two CPU processes under `accelerate launch` (gloo) give the same loss and update as one process on the same
global batch, with the pairs scored as prefix-shared rows (the head's outputs caught inside DDP's forward)."""

from pathlib import Path

import pytest
import torch

from replayrl.models.tiny import build_tiny_sequence_classifier, build_tokenizer
from tests.conftest import launch_two_processes
from tests.reward.distributed_worker import SMALL, result, run

WORKER = Path(__file__).with_name("distributed_worker.py")


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    check_two_equal_one(launch_two_processes(WORKER, tmp_path / "ddp", 29527), tmp_path)


def check_two_equal_one(two: dict, tmp_path) -> None:
    """The worker's 2-process result equals one process on the same global batch (loss abs 1e-5, parameters
    rtol 1e-4, atol 1e-6), and the score head moved."""
    one = result(run(str(tmp_path / "single"), per_device_batch=8))
    assert len(two["params"]) == len(one["params"])
    assert two["world"] == 2 and one["world"] == 1
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-5)
    changed = [not torch.equal(a, b) for a, b in zip(one["params"], run_params_before())]
    assert changed[-1]  # the score head (last parameter) moved: the hooked path reaches it
    for a, b in zip(two["params"], one["params"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def run_params_before() -> list[torch.Tensor]:
    model = build_tiny_sequence_classifier(build_tokenizer(), seed=0, **SMALL)
    return [p.detach() for p in model.parameters()]
