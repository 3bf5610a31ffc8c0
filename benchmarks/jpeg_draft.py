"""Does PIL's JPEG draft mode speed up the host's decode + random-resized crop, honestly?

  python benchmarks/jpeg_draft.py [--cifar_root=DIR] [--images=48] [--size=224]

``Image.draft`` lets libjpeg decode at 1/2, 1/4 or 1/8 scale, skipping most of the inverse DCT.
A random-resized crop's box depends only on the image's size, which the JPEG header gives before
decoding, so the box can be drawn first and the draft scale chosen per example. The crop stays
honest only if the reduced box is still at least ``--size`` on both sides: the final resize must
remain a downscale, as it is from the full decode. Otherwise draft would replace real pixels by
upsampled ones.

For JPEGs of several sizes (CIFAR-10 training images upsampled bicubically, quality 90, as
``augment_throughput.py`` builds its 224 inputs; smooth noise without ``--cifar_root``), this
prints, side by side in one run:
  * the fraction of crops (timm's scale (0.08, 1), ratio (3/4, 4/3)) that allow a reduction;
  * microseconds per example for full decode + crop + resize, and for header + box + draft
    decode + resize, on the same boxes;
  * the mean and largest absolute pixel difference between the two on the crops draft reduced.
Run it on one core (``taskset -c 0``) for per-core figures.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import numpy as np
from PIL import Image

from locvit.data.augment import random_resized_crop_box

SIZES = ((341, 256), (500, 375), (1000, 750), (2000, 1500))  # (width, height)


def _sources(cifar_root: str | None, count: int) -> list[Image.Image]:
  if cifar_root:
    files = sorted(Path(cifar_root, "train").glob("*/*.*"))[:: max(1, 50000 // count)][:count]
    return [Image.open(f).convert("RGB") for f in files]
  rng = np.random.default_rng(0)
  noise = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(count)]
  return [Image.fromarray(n) for n in noise]


def _jpeg(image: Image.Image, size: tuple[int, int]) -> bytes:
  out = io.BytesIO()
  image.resize(size, Image.Resampling.BICUBIC).save(out, format="JPEG", quality=90)
  return out.getvalue()


def _reduction(box: tuple[int, int, int, int], size: int) -> int:
  """The largest draft reduction (1, 2, 4, 8) that keeps the box at least ``size`` on both sides."""
  side = min(box[2] - box[0], box[3] - box[1])
  return max([r for r in (2, 4, 8) if side // r >= size], default=1)


def full_decode_crop(data: bytes, box, size: int) -> np.ndarray:
  with Image.open(io.BytesIO(data)) as img:
    img = img.convert("RGB")
    return np.asarray(img.resize((size, size), Image.Resampling.BICUBIC, box=box))


def draft_decode_crop(data: bytes, box, size: int) -> np.ndarray:
  with Image.open(io.BytesIO(data)) as img:
    width, height = img.size
    reduction = _reduction(box, size)
    if reduction > 1:  # draft picks the largest scale whose result is >= the requested size
      img.draft("RGB", (-(-width // reduction), -(-height // reduction)))
    sx, sy = img.size[0] / width, img.size[1] / height
    img = img.convert("RGB")
    scaled = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
    return np.asarray(img.resize((size, size), Image.Resampling.BICUBIC, box=scaled))


def _time_us(fn, jobs) -> float:
  start = time.perf_counter()
  for job in jobs:
    fn(*job)
  return (time.perf_counter() - start) / len(jobs) * 1e6


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cifar_root", default=None)
  parser.add_argument("--images", type=int, default=48)
  parser.add_argument("--crops", type=int, default=4, help="crops drawn per image")
  parser.add_argument("--size", type=int, default=224)
  args = parser.parse_args()
  sources = _sources(args.cifar_root, args.images)
  rng = np.random.default_rng(0)
  print(f"{args.images} JPEGs x {args.crops} crops per size, output {args.size}x{args.size}")
  print("| JPEG size | crops reduced | full decode + crop (us) | draft (us) | ratio | "
        "mean / max abs diff on reduced crops |")  # fmt: skip
  print("|---|---|---|---|---|---|")
  for width, height in SIZES:
    jpegs = [_jpeg(image, (width, height)) for image in sources]
    jobs = [
      (data, random_resized_crop_box(height, width, rng), args.size)
      for data in jpegs
      for _ in range(args.crops)
    ]
    reduced = [job for job in jobs if _reduction(job[1], args.size) > 1]
    full_us = _time_us(full_decode_crop, jobs)
    draft_us = _time_us(draft_decode_crop, jobs)
    if reduced:
      diffs = [
        np.abs(full_decode_crop(*job).astype(int) - draft_decode_crop(*job).astype(int))
        for job in reduced
      ]
      diff = f"{np.mean([d.mean() for d in diffs]):.2f} / {max(d.max() for d in diffs)}"
    else:
      diff = "none reduced"
    print(
      f"| {width}x{height} | {len(reduced) / len(jobs):.0%} | {full_us:.0f} | {draft_us:.0f} | "
      f"{full_us / draft_us:.2f}x | {diff} |"
    )


if __name__ == "__main__":
  main()
