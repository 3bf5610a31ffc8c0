"""Do the recipes' host-side augmentations keep up with training? Side by side in one run.

  python benchmarks/augment_throughput.py [--cifar_root=/tmp/cifar] [--batches=8] [--steps=3]

Two recipes (the presets of ``configs/recipes.py``), each measured as
  1. pipeline alone: images/s out of the training iterator (decode + host augmentation +
     normalisation, grain threads as configured);
  2. train step alone: images/s of the library's jitted training step (forward, backward, AdamW,
     the preset's on-device Mixup/CutMix and random erasing) on one resident batch;
and the ratio (1) / (2), goal >= 3x:

  deit at 224       ConViT-S (``convit_small``): bicubic random-resized crop + flip +
                    rand-m9-mstd0.5-inc1 + repeated augmentation x3, on JPEG images of 256 x 341
                    (CIFAR-10 training images upsampled bicubically and JPEG-encoded at quality 90
                    in memory, decoded per read, like a resized ImageNet copy);
  small_vit at 32   GMM-ViT (``gmm_vit_smalldata_d9_patch4_32``): random crop (pad 4) + flip +
                    autoaug-cifar10, on the CIFAR-10 JPEG image folder.

The train steps use small batches (``--batch_224``, ``--batch_32``) to keep the run short; on CPU
images/s of a step barely depends on the batch size once it is a few images.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from pathlib import Path

import flax.linen as nn
import jax
import kit
import numpy as np
from PIL import Image

from locvit import data as data_lib
from locvit.configs import recipes
from locvit.configs.common import base_config
from locvit.platform import sharding


class JpegSource:
  """`n` CIFAR-10 training images upsampled to `size` (h, w) and held as JPEG bytes."""

  def __init__(self, root: str, n: int, size: tuple[int, int]) -> None:
    folder = data_lib.ImageFolderSource(root, "train")
    picks = np.linspace(0, len(folder) - 1, n).astype(int)  # All classes.
    self.blobs, labels = [], []
    for i in picks:
      ex = folder[int(i)]
      img = Image.fromarray(ex["image"]).resize(size[::-1], Image.Resampling.BICUBIC)
      buf = io.BytesIO()
      img.save(buf, format="JPEG", quality=90)
      self.blobs.append(buf.getvalue())
      labels.append(int(ex["label"]))
    self.labels = np.asarray(labels, np.int32)
    self.num_classes, self.class_names = folder.num_classes, folder.class_names

  def __len__(self) -> int:
    return len(self.blobs)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    with Image.open(io.BytesIO(self.blobs[int(index)])) as img:
      image = np.asarray(img.convert("RGB"), dtype=np.uint8)
    return {"image": image, "label": self.labels[int(index)]}


def pipeline_rate(config, source, batch_size: int, batches: int) -> float:
  it = data_lib.make_train_iterator(config.data, source, seed=0, local_batch_size=batch_size)
  next(it)  # Start-up: threads, first prefetch.
  t0 = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * batch_size / (time.perf_counter() - t0)


def step_rate(config, num_classes: int, image_size: int, batch_size: int, steps: int) -> float:
  """images/s of the library's training step on one resident batch (after one compile step)."""
  built = kit.parts(config, (image_size, image_size, 3), num_classes)
  keys = jax.random.split(jax.random.key(1))
  batch = {
    "image": jax.random.normal(keys[0], (batch_size, *built.image_shape)),
    "label": jax.random.randint(keys[1], (batch_size,), 0, num_classes),
  }
  with jax.set_mesh(built.mesh), nn.logical_axis_rules(built.rules):
    state, step = built.init(), kit.sharded_step(built)
    resident = sharding.global_batch(batch, built.batch_sharding)
    state, metrics = step(state, resident)  # Compile.
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for _ in range(steps):
      state, metrics = step(state, resident)
    jax.block_until_ready(metrics)
  return steps * batch_size / (time.perf_counter() - t0)


def deit_config(threads: int):
  c = recipes.apply(base_config(), "deit")
  c.model.name = "convit_small"
  c.data.image_size = 224
  c.data.num_threads = threads
  return c


def small_vit_config(root: str, threads: int):
  c = base_config()
  recipes.small_vit(c, "autoaug-cifar10")
  c.model.name = "gmm_vit_smalldata_d9_patch4_32"
  c.data.source, c.data.root, c.data.image_size = "image_folder", root, 32
  c.data.mean, c.data.std = data_lib.CIFAR10_MEAN, data_lib.CIFAR10_STD
  c.data.num_threads = threads
  return c


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--cifar_root", default="/tmp/cifar", help="CIFAR-10 image folder")
  p.add_argument("--images_224", type=int, default=512, help="synthetic 256x341 JPEG images")
  p.add_argument("--pipeline_batch", type=int, default=64)
  p.add_argument("--batches", type=int, default=8, help="timed pipeline batches per recipe")
  p.add_argument("--batch_224", type=int, default=8, help="train-step batch, ConViT-S at 224")
  p.add_argument("--batch_32", type=int, default=32, help="train-step batch, GMM-ViT at 32")
  p.add_argument("--steps", type=int, default=3, help="timed train steps per model")
  p.add_argument("--threads", type=int, default=4, help="grain threads (data.num_threads)")
  args = p.parse_args()

  print(
    f"devices: {jax.device_count()} x {jax.devices()[0].platform}; {os.cpu_count()} cores; "
    f"load {os.getloadavg()[0]:.1f}; grain threads {args.threads}"
  )
  rows = []

  cfg = deit_config(args.threads)
  source = JpegSource(args.cifar_root, args.images_224, (256, 341))
  d = cfg.data
  what = (
    f"deit @224: RRC {d.interpolation} + flip + {d.auto_augment} + RA x"
    f"{d.repeated_augmentations} on 256x341 JPEG"
  )
  pipe = pipeline_rate(cfg, source, args.pipeline_batch, args.batches)
  model = step_rate(cfg, 1000, 224, args.batch_224, args.steps)
  rows.append((what, f"{cfg.model.name}, batch {args.batch_224}", pipe, model))

  cfg = small_vit_config(args.cifar_root, args.threads)
  source = data_lib.make_source(cfg.data, cfg.data.train_split)
  d = cfg.data
  what = (
    f"small_vit @32: pad-{d.crop_padding} crop + flip + {d.auto_augment} + RA x"
    f"{d.repeated_augmentations} on CIFAR-10 JPEG folder"
  )
  pipe = pipeline_rate(cfg, source, args.pipeline_batch * 2, args.batches)
  model = step_rate(cfg, 10, 32, args.batch_32, args.steps)
  rows.append((what, f"{cfg.model.name}, batch {args.batch_32}", pipe, model))

  print(f"load after: {os.getloadavg()[0]:.1f}")
  for what, model_name, pipe, model in rows:
    print(f"\n{what}")
    print(f"  pipeline alone     {pipe:10.1f} images/s")
    print(f"  train step alone   {model:10.1f} images/s  ({model_name})")
    print(f"  pipeline / train step = {pipe / model:.1f}x  (goal >= 3x)")


if __name__ == "__main__":
  if not Path("configs").is_dir():
    raise SystemExit("run from the repository root: python benchmarks/augment_throughput.py")
  main()
