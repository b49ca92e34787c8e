"""One torch thread: the tiny models gain nothing from more, and the machine is shared."""

import torch

torch.set_num_threads(1)
