"""Does the input pipeline keep up with training? Prints the ratio, measured side by side.

  python benchmarks/input_pipeline.py --config=configs/cifar10_deit.py \\
      --config.data.source=image_folder --config.data.root=ROOT [--steps=30]

Three measurements in one run, on the same machine:
  1. pipeline alone: images/s from the training iterator (decode + augment + normalise);
  2. train step alone: images/s of the jitted step on one resident batch;
  3. end to end: the real loop (pipeline feeding the step), and the share of time spent waiting
     for data.
The goal is (1) >= 3x (2).
"""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import kit
from absl import app, flags
from ml_collections import config_flags

from locvit import data as data_lib
from locvit.platform import sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/cifar10_deit.py", lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps per measurement.")


def main(argv):
  del argv
  config = _CONFIG.value
  source = data_lib.make_source(config.data, config.data.train_split)
  it = data_lib.make_train_iterator(config.data, source, seed=0, local_batch_size=config.batch_size)
  steps, batch_size = _STEPS.value, config.batch_size

  for _ in range(3):
    next(it)
  t0 = time.perf_counter()
  for _ in range(steps):
    batch = next(it)
  pipeline = steps * batch_size / (time.perf_counter() - t0)

  built = kit.parts(config, batch["image"].shape[1:], source.num_classes)
  batch_sh = built.batch_sharding
  with jax.set_mesh(built.mesh), nn.logical_axis_rules(built.rules):
    state, step = built.init(), kit.sharded_step(built)
    resident = sharding.global_batch(batch, batch_sh)
    for _ in range(3):
      state, m = step(state, resident)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(steps):
      state, m = step(state, resident)
    jax.block_until_ready(m)
    compute = steps * batch_size / (time.perf_counter() - t0)

    waiting, t0 = 0.0, time.perf_counter()
    for _ in range(steps):
      w0 = time.perf_counter()
      b = sharding.global_batch(next(it), batch_sh)
      waiting += time.perf_counter() - w0
      state, m = step(state, b)
    jax.block_until_ready(m)
    end_to_end = steps * batch_size / (time.perf_counter() - t0)

  print(
    f"devices: {jax.device_count()} x {jax.devices()[0].platform}; model {config.model.name};"
    f" batch {batch_size}; augment {config.data.train_augment}; image {built.image_shape}"
  )
  print(f"pipeline alone     {pipeline:10.1f} images/s")
  print(f"train step alone   {compute:10.1f} images/s")
  print(
    f"end to end         {end_to_end:10.1f} images/s  (waiting for data "
    f"{100 * waiting / (steps * batch_size / end_to_end):.1f}% of the time)"
  )
  print(f"pipeline / train step = {pipeline / compute:.2f}x  (goal >= 3x)")


if __name__ == "__main__":
  app.run(main)
