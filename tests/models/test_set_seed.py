"""`from replayrl import set_seed`, as TRL v0.7.1's PPO scripts do `from trl import set_seed`."""

import random

import numpy as np
import torch

from replayrl import set_seed


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_set_seed_makes_python_numpy_and_torch_repeat():
    set_seed(7)
    first = draws()
    set_seed(7)
    assert draws() == first
    set_seed(8)
    assert draws() != first
