"""Measures the training iterator's throughput (images/s), the pipeline alone.

  python benchmarks/iterator_throughput.py --source=image_folder --root=DIR --image_size=32 \
      --augment=crop_flip --batch=256 --steps=100 --threads=4
"""

from __future__ import annotations

import argparse
import time

from locvit.data import default_data_config, make_source, make_train_iterator


def parser() -> argparse.ArgumentParser:
  """The command line above."""
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--source", default="digits")
  p.add_argument("--root", default=None)
  p.add_argument("--name", default="cifar10")
  p.add_argument("--image_size", type=int, default=None)
  p.add_argument("--augment", default="crop_flip")
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--warmup", type=int, default=10)
  p.add_argument("--threads", type=int, default=4)
  p.add_argument("--prefetch", type=int, default=4)
  return p


def main() -> None:
  """Parses the flags above, runs ``--warmup`` then ``--steps`` batches and prints images/s."""
  args = parser().parse_args()

  cfg = default_data_config()
  cfg.source, cfg.root, cfg.name = args.source, args.root, args.name
  cfg.train_augment = args.augment
  cfg.num_threads, cfg.prefetch = args.threads, args.prefetch
  if args.image_size:
    cfg.image_size = args.image_size
  source = make_source(cfg, cfg.train_split)
  it = make_train_iterator(cfg, source, seed=0, local_batch_size=args.batch)
  for _ in range(args.warmup):
    next(it)
  t0 = time.perf_counter()
  for _ in range(args.steps):
    batch = next(it)
  dt = time.perf_counter() - t0
  print(
    f"{source!r} augment={args.augment} batch={args.batch} threads={args.threads}: "
    f"{args.steps * args.batch / dt:,.0f} images/s ({dt / args.steps * 1e3:.1f} ms/batch, "
    f"image {batch['image'].shape} {batch['image'].dtype})"
  )


if __name__ == "__main__":
  main()
