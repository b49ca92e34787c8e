"""The generalised JSD alone at the 152k vocabulary: peak RSS above its start and CPU seconds of one forward +
backward of `chunked_generalized_jsd` over 256 positions from 256-wide hidden states (fp32, one thread).

    PYTHONPATH=$PWD python benchmarks/jsd_memory.py [--chunk 55] [--beta 1.0]

Prints one line: chunk size, peak MiB above the start (sampled every 2 ms, after a warm-up pass), CPU seconds, the
summed divergence and the lm_head gradient's norm (so two versions can be checked to do the same work).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch

from replayrl.algos.distillation import chunked_generalized_jsd
from replayrl.algos.logprobs import default_chunk_size

VOCAB, WIDTH, POSITIONS = 151_936, 256, 256


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunk", type=int, default=default_chunk_size(VOCAB))
    p.add_argument("--beta", type=float, default=1.0)
    opts = p.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    weight = (0.02 * torch.randn(VOCAB, WIDTH, generator=gen)).requires_grad_()
    teacher_weight = 0.02 * torch.randn(VOCAB, WIDTH, generator=gen)
    hidden = torch.randn(POSITIONS, WIDTH, generator=gen).requires_grad_()
    teacher_hidden = torch.randn(POSITIONS, WIDTH, generator=gen)

    def step() -> float:
        out = chunked_generalized_jsd(
            (hidden, weight, None), (teacher_hidden, teacher_weight, None), opts.beta, 1.0, opts.chunk
        )
        out.sum().backward()
        return out.sum().item()

    step()  # warm-up: allocator pools, lazy initialisation
    weight.grad = hidden.grad = None
    base, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    thread = threading.Thread(target=sample)
    thread.start()
    start = time.process_time()
    total = step()
    cpu = time.process_time() - start
    done.set()
    thread.join()
    print(
        f"chunk {opts.chunk}: peak +{(peak[0] - base) / 2**20:.0f} MiB above the start, {cpu:.2f} CPU s, "
        f"divergence sum {total:.6f}, lm_head grad norm {weight.grad.norm():.6f}"
    )


if __name__ == "__main__":
    main()
