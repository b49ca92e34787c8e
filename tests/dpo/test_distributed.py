"""Two CPU processes under `accelerate launch` (gloo) give the same precomputed reference log-probs, loss and
update as one process on the same global batch."""

from pathlib import Path

import pytest
import torch

from tests.conftest import launch_two_processes
from tests.dpo.distributed_worker import result, run

WORKER = Path(__file__).with_name("distributed_worker.py")


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    check_two_equal_one(launch_two_processes(WORKER, tmp_path / "ddp", 29523), tmp_path)


def check_two_equal_one(two: dict, tmp_path) -> None:
    """The worker's 2-process result equals one process on the same global batch (abs 1e-5 on log-probs and
    loss; parameters rtol 1e-4, atol 1e-6)."""
    one = result(run(str(tmp_path / "single"), per_device_batch=8))
    assert len(two["params"]) == len(one["params"])
    assert two["world"] == 2 and one["world"] == 1
    assert two["ref_chosen_logps"] == pytest.approx(one["ref_chosen_logps"], abs=1e-5)  # gathered in order
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-5)
    for a, b in zip(two["params"], one["params"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
