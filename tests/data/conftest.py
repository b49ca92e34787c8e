import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny models here run fastest on one thread, and the test machine's cores are shared."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
