"""Decode once + crop and flip on the device: host cost per example and step cost, side by side.

  python benchmarks/augment_placement.py --cifar_root=ROOT [--train_fraction=0.1] [--batch_size=128]
      [--auto_augment=autoaug-cifar10]

The script pins itself to one CPU core before JAX starts, so every figure is per core.

1. Host microseconds per training example of the CIFAR crop_flip recipe (pad 4, crop 32, flip),
   steady state (after one epoch), through ``locvit.data.make_train_iterator``:
     host, streaming       decode + pad-crop + flip on the host every epoch (the old path);
     host, decoded once    the same ops on the images kept decoded (data.decoded_cache_mb);
     device, decoded once  the host only gathers the kept images (data.augment_on='device').
2. The training step of the smallest paper model (GMM-ViT d9 at 32, ``configs/gmm_table1.py``)
   with and without the crop and flip in it, in interleaved rounds; the median round.
3. Host cores needed to feed that step: step images/s x host seconds per example.

``--auto_augment=POLICY`` (e.g. the GMM recipe's 'autoaug-cifar10') adds the policy after the flip
in every arm: on the host in the host arms, inside the step in the device arms.

``--deit_images=N`` adds the DeiT recipe at 224 (bicubic random-resized crop + flip +
``rand-m9-mstd0.5-inc1``): N CIFAR-10 training images upsampled to 341x256 and stored as quality-90
JPEGs (a resized-ImageNet-like decode), read with no decoded cache, so every read costs what the
first epoch does. The host path runs every op on the host; the device path leaves the host the
decode and the cut of the crop box onto a canvas (the crop's resize, the flip and RandAugment run in
the step). Host cores to feed ``--deit_rate`` images/s follow.

``--dispatch_only`` (no CIFAR needed) times part 5 alone: data.auto_augment on the device, the
per-example select (every op computed for every example, the drawn one kept) against grouping the
batch by drawn op (each example computes its ops only), at 32 and at 224, interleaved rounds:

  python benchmarks/augment_placement.py --dispatch_only [--dispatch_batch=32] [--rounds=5]

``--deit_step=MODEL`` (e.g. deit_small_patch16_224; no CIFAR needed) times part 6 alone: the
DeiT recipe's training step at 224 (bf16 off CPU) on a batch resident on the device, the model
alone (the batch already augmented) against the device path (the crop's resize from the host's
canvas and taps, the flip and rand-m9-mstd0.5-inc1 in the step), with the ops selected per example
and grouped by op; the goal on a GPU is a device path step <= 1.25x the model's:

  python benchmarks/augment_placement.py --deit_step=deit_small_patch16_224 [--deit_step_batch=128]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import flax.linen as nn
import jax
import kit
import numpy as np

from locvit import data as data_lib
from locvit.configs.common import base_config
from locvit.configs.gmm_table1 import get_config
from locvit.configs.recipes import deit_recipe
from locvit.data import device_autoaugment, resample
from locvit.platform import sharding, xla_options

HOST_PATHS = {
  "host, streaming": {"augment_on": "host", "decoded_cache_mb": 0},
  "host, decoded once": {"augment_on": "host"},
  "device, decoded once": {"augment_on": "device"},
}


def data_config(root: str, train_fraction: float, **fields):
  c = data_lib.default_data_config()
  c.update(
    dict(source="image_folder", root=root, image_size=32, train_augment="crop_flip", num_threads=1)
  )
  c.update(dict(prefetch=2, train_fraction=train_fraction, mean=data_lib.CIFAR10_MEAN))
  c.update(fields)
  return c


def host_microseconds(cfg, batch_size: int, batches: int) -> float:
  """Host microseconds per example after one full epoch (the cache, if any, is then full)."""
  source = data_lib.make_source(cfg, cfg.train_split)
  it = data_lib.make_train_iterator(cfg, source, seed=0, local_batch_size=batch_size)
  for _ in range(len(source) // batch_size):
    next(it)
  t0 = time.perf_counter()
  for _ in range(batches):
    next(it)
  return (time.perf_counter() - t0) / (batches * batch_size) * 1e6


def deit_microseconds(cifar_root: str, count: int, batch_size: int) -> dict[str, float]:
  """Host microseconds per example of the DeiT recipe at 224, host path against device path."""
  with tempfile.TemporaryDirectory() as tmp:
    root = kit.deit_jpeg_folder(cifar_root, count, Path(tmp))
    micro = {}
    for augment_on in ("host", "device"):
      cfg = data_config(
        str(root),
        1.0,
        image_size=224,
        train_augment="rrc_flip",
        auto_augment="rand-m9-mstd0.5-inc1",
        mean=data_lib.IMAGENET_MEAN,
        decoded_cache_mb=0,
        augment_on=augment_on,
        rrc_canvas=352,  # the JPEGs' longer side, 341, rounded up: every box travels
      )
      micro[augment_on] = host_microseconds(cfg, batch_size, max(1, count // batch_size))
  return micro


def make_step(augment_on: str, batch_size: int, auto_augment: str | None):
  """``(parts, jitted step, batch)``: the GMM-ViT d9 training step over the config's mesh, with
  the crop and flip (and ``auto_augment``) on the host or in the step."""
  config = get_config("vit,cifar10,gmm")
  config.batch_size = batch_size
  config.data.auto_augment = auto_augment
  config.data.train_augment, config.data.augment_on = "crop_flip", augment_on
  built = kit.parts(config, (32, 32, 3), 10)
  rng = np.random.default_rng(0)
  batch = {
    "image": rng.integers(0, 256, (batch_size, 32, 32, 3), dtype=np.uint8),
    "label": rng.integers(0, 10, (batch_size,), dtype=np.int32),
  }
  return built, kit.sharded_step(built), sharding.global_batch(batch, built.batch_sharding)


def step_seconds(batch_size: int, steps: int, rounds: int, auto_augment) -> dict[str, float]:
  """Median seconds per step of each arm, timed in interleaved rounds."""
  arms = {name: make_step(name, batch_size, auto_augment) for name in ("host", "device")}
  built = arms["host"][0]
  times: dict[str, list[float]] = {name: [] for name in arms}
  with jax.set_mesh(built.mesh), nn.logical_axis_rules(built.rules):
    states = {}
    for name, (built, step, batch) in arms.items():
      state = built.init()
      for _ in range(3):  # compile + warm up
        state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      states[name] = state
    for _ in range(rounds):
      for name, (_, step, batch) in arms.items():
        t0 = time.perf_counter()
        for _ in range(steps):
          states[name], metrics = step(states[name], batch)
        jax.block_until_ready(metrics)
        times[name].append((time.perf_counter() - t0) / steps)
  return {name: statistics.median(t) for name, t in times.items()}


def dispatch_seconds(size: int, batch: int, spec: str, rounds: int) -> dict[str, float]:
  """Median seconds per batch of device RandAugment (`spec`, bicubic) on a uint8 batch of
  size x size images, per dispatch ('select', 'grouped'), timed in interleaved rounds."""
  cfg = data_lib.default_data_config()
  cfg.update(dict(auto_augment=spec, image_size=size, interpolation="bicubic"))
  images = np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
  arms = {
    how: jax.jit(lambda key, x, how=how: device_autoaugment.auto_augment(key, x, cfg, how=how))
    for how in ("select", "grouped")
  }
  times: dict[str, list[float]] = {how: [] for how in arms}
  for run in arms.values():
    run(jax.random.key(0), images).block_until_ready()  # compile
  for r in range(rounds):
    for how, run in arms.items():
      t0 = time.perf_counter()
      run(jax.random.key(r + 1), images).block_until_ready()
      times[how].append(time.perf_counter() - t0)
  return {how: statistics.median(t) for how, t in times.items()}


def print_dispatch(batch: int, rounds: int) -> None:
  spec = "rand-m9-mstd0.5-inc1"
  print(f"\n5. device {spec} (bicubic), batch {batch}, median of {rounds}: select vs grouped")
  print(f"{'size':>5s} {'select ms':>10s} {'grouped ms':>11s} {'select/grouped':>15s}")
  for size in (32, 224):
    sec = dispatch_seconds(size, batch, spec, rounds)
    ratio = sec["select"] / sec["grouped"]
    print(f"{size:5d} {1e3 * sec['select']:10.1f} {1e3 * sec['grouped']:11.1f} {ratio:14.1f}x")


def deit_batches(config, batch_size: int, num_classes: int) -> dict[str, dict]:
  """Per arm, a batch as the host sends it: 'model only' augmented uint8 224 images; 'device path'
  random-resized crop boxes of random 341x256 images on the canvas, with their taps."""
  rng = np.random.default_rng(0)
  label = rng.integers(0, num_classes, batch_size).astype(np.int32)
  size, cut = config.data.image_size, resample.box_cutter(config.data)
  boxes = [cut(rng.integers(0, 256, (256, 341, 3), dtype=np.uint8), rng) for _ in range(batch_size)]
  device = {
    "image": resample.on_canvas([b["image"] for b in boxes], resample.canvas_size(config.data)),
    "resize_taps": np.stack([b["resize_taps"] for b in boxes]),
    "resize_transposed": np.stack([b["resize_transposed"] for b in boxes]),
    "label": label,
  }
  model_only = {"image": rng.integers(0, 256, (batch_size, size, size, 3), dtype=np.uint8)}
  return {"model only": model_only | {"label": label}, "device path": device}


def deit_step_seconds(model: str, batch_size: int, steps: int, rounds: int) -> dict[str, float]:
  """Median seconds per DeiT-recipe step at 224 on a resident batch: the model only, and the
  device path with RandAugment's ops selected per example ('select') or grouped by op; the
  model only and the grouped path also compiled with XLA's ``gpu_graphs`` options (the grouped
  path's loop and op choice evaluated on the device)."""
  num_classes, arms = 1000, {}
  for name, kind, how, setting in [
    ("model only", "model only", None, "none"),
    ("device path, select", "device path", "select", "none"),
    ("device path, grouped", "device path", "grouped", "none"),
    ("model only, graphs", "model only", None, "gpu_graphs"),
    ("grouped, graphs", "device path", "grouped", "gpu_graphs"),
  ]:
    config = deit_recipe(base_config())
    config.model.name, config.batch_size = model, batch_size
    config.mixed_precision = jax.default_backend() != "cpu"
    config.data.augment_on = "host" if how is None else "device"
    config.data.image_size, config.data.rrc_canvas = 224, 352
    batch = jax.device_put(deit_batches(config, batch_size, num_classes)[kind])
    state, step = kit.state_and_step(config, (224, 224, 3), num_classes)
    options = xla_options.compiler_options(setting, jax.default_backend())
    # The dispatch is chosen while the step is traced: force this arm's.
    with mock.patch.object(device_autoaugment, "dispatch", return_value=how):
      arms[name] = [step.lower(state, batch), state, batch, options]
  # The compilations (about a minute each at 224 on an H200) run side by side.
  with concurrent.futures.ThreadPoolExecutor(len(arms)) as pool:
    compiled = pool.map(lambda arm: arm[0].compile(arm[3]), arms.values())
    for arm, executable in zip(arms.values(), compiled):
      arm[0] = executable
  times: dict[str, list[float]] = {name: [] for name in arms}
  for r in range(rounds + 1):  # round 0 warms up
    for name, arm in arms.items():
      t0 = time.perf_counter()
      for _ in range(steps):
        arm[1], metrics = arm[0](arm[1], arm[2])
      jax.block_until_ready(metrics)
      if r:
        times[name].append((time.perf_counter() - t0) / steps)
  return {name: statistics.median(t) for name, t in times.items()}


def print_deit_step(model: str, batch_size: int, steps: int, rounds: int) -> None:
  seconds = deit_step_seconds(model, batch_size, steps, rounds)
  device = jax.devices()[0].device_kind
  print(f"\n6. {model}, DeiT recipe at 224, batch {batch_size}, resident, {device}")
  for name, sec in seconds.items():
    ratio = sec / seconds["model only"]
    print(f"{name:22s} {1e3 * sec:9.1f} ms/step {ratio:7.2f}x the model's")
  cost = seconds["device path, grouped"] / seconds["model only"]
  print(f"device path (grouped) / model only = {cost:.3f}x (goal on a GPU <= 1.25x)")
  cost = seconds["grouped, graphs"] / seconds["model only, graphs"]
  print(f"under gpu_graphs, grouped / model only = {cost:.3f}x")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--cifar_root", help="CIFAR-10 image folder (ROOT/train/...)")
  p.add_argument("--dispatch_only", action="store_true", help="part 5 only (no --cifar_root)")
  p.add_argument("--dispatch_batch", type=int, default=32, help="part 5's batch size")
  p.add_argument("--deit_step", default=None, help="part 6 only, with this 224 model")
  p.add_argument("--deit_step_batch", type=int, default=128, help="part 6's batch size")
  p.add_argument("--train_fraction", type=float, default=0.1)
  p.add_argument("--batch_size", type=int, default=128)
  p.add_argument("--batches", type=int, default=20, help="timed host batches per path")
  p.add_argument("--steps", type=int, default=3, help="timed steps per arm per round")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--host_only", action="store_true", help="part 1 only")
  p.add_argument("--deit_images", type=int, default=0, help="part 4: the DeiT recipe at 224")
  p.add_argument(
    "--deit_rate", type=float, default=4530.0, help="images/s to feed (DeiT-S bf16 on an H200)"
  )
  p.add_argument(
    "--auto_augment", default=None, help="a policy after the flip, e.g. autoaug-cifar10"
  )
  p.add_argument(
    "--all_cores", action="store_true", help="no pinning to one core (an accelerator's compiles)"
  )
  args = p.parse_args()
  if not args.all_cores:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before JAX starts its thread pools
  print(f"{len(os.sched_getaffinity(0))} core(s), {jax.devices()[0].device_kind}")
  if args.dispatch_only:
    return print_dispatch(args.dispatch_batch, args.rounds)
  if args.deit_step:
    return print_deit_step(args.deit_step, args.deit_step_batch, args.steps, args.rounds)
  if not args.cifar_root:
    p.error("--cifar_root is required (or --dispatch_only)")
  micro = {}
  for name, fields in HOST_PATHS.items():
    cfg = data_config(
      args.cifar_root, args.train_fraction, auto_augment=args.auto_augment, **fields
    )
    micro[name] = host_microseconds(cfg, args.batch_size, args.batches)
  ops = "crop + flip" + (f" + {args.auto_augment}" if args.auto_augment else "")
  print(f"\n1. host cost per example, CIFAR-10, {ops}, steady state, one core")
  print(f"{'path':24s} {'us/example':>11s} {'images/s':>10s} {'vs streaming':>13s}")
  for name, us in micro.items():
    ratio = micro["host, streaming"] / us
    print(f"{name:24s} {us:11.1f} {1e6 / us:10,.0f} {ratio:12.1f}x")
  if args.deit_images:
    deit = deit_microseconds(args.cifar_root, args.deit_images, 32)
    print("\n4. DeiT recipe at 224 from 341x256 JPEGs, first epoch, one core, batch 32")
    cores = f"cores for {args.deit_rate:,.0f}/s"
    print(f"{'path':42s} {'us/example':>11s} {'images/s':>10s} {cores:>18s}")
    for name, us in deit.items():
      ops = "decode + RRC + flip + RandAugment" if name == "host" else "decode + box cut"
      label = f"{name}: {ops}"
      print(f"{label:42s} {us:11.1f} {1e6 / us:10,.0f} {args.deit_rate * us * 1e-6:18.1f}")
  if args.host_only:
    return
  seconds = step_seconds(args.batch_size, args.steps, args.rounds, args.auto_augment)
  print(f"\n2. GMM-ViT d9 at 32, training step, batch {args.batch_size}, median of {args.rounds}")
  for name in ("host", "device"):
    print(f"{ops} on the {name:7s} {1e3 * seconds[name]:9.1f} ms/step")
  cost = seconds["device"] / seconds["host"]
  verdict = "meets" if cost <= 1.10 else "misses"
  print(f"device / host step time = {cost:.3f}x ({verdict} the goal <= 1.10x)")
  print("\n3. host cores needed: images/s x host seconds per example")
  print(f"{'path':24s} {'this step':>22s} {'100,000 images/s':>17s}")
  for name, us in micro.items():
    rate = args.batch_size / seconds["device" if name.startswith("device") else "host"]
    print(f"{name:24s} {rate * us * 1e-6:8.3f} at {rate:7,.0f}/s {1e5 * us * 1e-6:17.1f}")
  print_dispatch(args.dispatch_batch, args.rounds)


if __name__ == "__main__":
  main()
