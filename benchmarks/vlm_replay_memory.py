"""What the replay buffer holds for a vision-language group: the pixel inputs of one 448x448 image through
Qwen2-VL / Qwen2.5-VL's real image-processor settings (patch 14, merge 2, temporal patch 2), stored once per group
(`VisionInputs`) against one copy per completion. CPU only, no model:

    python benchmarks/vlm_replay_memory.py [--size 448] [--num_generations 8] [--groups 64]
"""

import argparse

import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil

from replayrl.data.vision import VisionInputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--groups", type=int, default=64)
    a = parser.parse_args()
    enc = Qwen2VLImageProcessorPil()(images=[Image.new("RGB", (a.size, a.size), (200, 10, 10))], return_tensors="pt")
    item = dict(enc.items())
    group = VisionInputs([item], torch.zeros(a.num_generations, dtype=torch.long))
    mib, G = group.nbytes() / 2**20, a.num_generations
    print(f"{a.size}x{a.size} image: pixel_values {tuple(item['pixel_values'].shape)}, "
          f"{int(item['image_grid_thw'].prod()) // 4} image tokens")  # fmt: skip
    print(f"per group: {mib:.2f} MiB stored (one copy per completion: {G * mib:.2f} MiB)")
    print(f"{a.groups}-group buffer: {a.groups * mib:.0f} MiB (one copy per completion: {a.groups * G * mib:.0f} MiB)")


if __name__ == "__main__":
    main()
