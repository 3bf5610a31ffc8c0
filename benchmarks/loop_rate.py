"""The training loop's own rate for a paper-protocol row: the training split fed by the host
pipeline (``data.train_split_on='host'``) against held on the device (``'device'``), side by side.

  python benchmarks/loop_rate.py --cifar_root=CIFAR10_JPEG [--row=gmm_table1_cifar10:vit]
      [--steps=1000] [--host_only] [--steps_per_dispatch=1,4] [--tiny] [--batch_size=B]

Each arm runs ``locvit.train.train_and_evaluate`` on the row's config (the plan's model, recipe,
batch and data; no evaluation or checkpoint until the last step) for ``--steps`` steps in a
temporary workdir and reads the loop's logged rate (``perf/steps_per_sec``, one row per
``--log_every`` steps). It prints per arm the seconds to the first step (building, decoding a
split held on the device, compiling), the median steps/s over the logged intervals after the
first epoch (a host-fed run decodes its first epoch's JPEGs as it trains), the whole run's
images/s, and each arm's steady rate against the host-fed arm's.

``--host_only`` replaces the model's step by one that only reads its batch (the sum of the
gathered or transferred images), so the rate is the host's ceiling: the most steps per second
the loop can dispatch, whatever the accelerator. ``--tiny`` shrinks the model to one block of
width 16 (a CPU-sized check that the arms run).
"""

from __future__ import annotations

import itertools
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from locvit import metrics, reproduce, train
from locvit.configs.common import complete_config
from locvit.data import resident

_ROW = flags.DEFINE_string("row", "gmm_table1_cifar10:vit", "PLAN:ROW of locvit.reproduce.")
_CIFAR_ROOT = flags.DEFINE_string("cifar_root", None, "CIFAR-10 JPEG folders ($CIFAR10_ROOT).")
_STEPS = flags.DEFINE_integer("steps", 1000, "Steps per arm.")
_LOG_EVERY = flags.DEFINE_integer("log_every", 50, "Steps per logged interval.")
_FRACTION = flags.DEFINE_float("train_fraction", 1.0, "data.train_fraction of the row.")
_DISPATCH = flags.DEFINE_list("steps_per_dispatch", ["1"], "config.steps_per_dispatch values.")
_HOST_ONLY = flags.DEFINE_bool("host_only", False, "Time the loop with a step that only reads.")
_TINY = flags.DEFINE_bool("tiny", False, "One block of width 16 instead of the row's model.")
_BATCH = flags.DEFINE_integer("batch_size", None, "Another batch size than the row's.")


def arm_config(place: str, steps_per_dispatch: int):
  """The row's config on ``place`` ('host' or 'device'), for ``--steps`` steps."""
  plan, _, row = _ROW.value.partition(":")
  config = complete_config(reproduce.row_config(reproduce.get_plan(plan)["rows"][row]))
  config.data.train_split_on = place
  config.data.train_fraction = _FRACTION.value
  config.total_steps, config.steps_per_dispatch = _STEPS.value, steps_per_dispatch
  config.log_every_steps, config.eval_every_steps = _LOG_EVERY.value, 0
  config.checkpoint_every_steps = 0
  if _BATCH.value:
    config.batch_size = config.eval_batch_size = _BATCH.value
  config.data.eval_split = f"test[:{config.batch_size}]"  # the final evaluation: one batch
  if _TINY.value:
    config.model.overrides.update(depth=1, embed_dim=16, num_heads=1)
  return config


def reading_step_fn(run):
  """A step that only reads its batches (gathered on the device, or transferred) and counts the
  step: the loop's host ceiling. (It takes no parameters: returning them undonated would copy
  them every step.)"""

  @jax.jit
  def read(step, batches, train_split):
    images = [resident.gather(train_split, b)["image"] for b in batches]
    total = sum(jnp.sum(x, dtype=jnp.float32) for x in images)
    metrics = {name: total for name in ("train/loss", "train/accuracy", "train/lr")}
    return step + len(batches), {**metrics, "train/grad_norm": total}

  def step_fn(state, batches, teacher_variables, health):
    step, metrics = read(state.step, batches, run.train_split)
    return state.replace(step=step), metrics, health

  return step_fn


def run_arm(place: str, steps_per_dispatch: int) -> dict[str, float]:
  """Seconds to the first step, the median steps/s of the logged intervals after the first
  epoch, and the whole run's images/s."""
  config = arm_config(place, steps_per_dispatch)
  written: list[tuple[int, float]] = []  # (step, time its row was written)
  per_epoch: list[float] = []  # steps per epoch, from a training row's epoch
  write = metrics.MetricWriter.write

  def timed_write(self, step, record):
    written.append((step, time.perf_counter()))
    if record.get("epoch"):
      per_epoch.append(step / record["epoch"])
    return write(self, step, record)

  metrics.MetricWriter.write = timed_write
  start = time.perf_counter()
  try:
    with tempfile.TemporaryDirectory() as workdir:
      train.train_and_evaluate(config, workdir)
  finally:
    metrics.MetricWriter.write = write
  wall = time.perf_counter() - start
  steps_per_epoch = round(per_epoch[-1])
  intervals = [
    (step - before) / (t - t_before)
    for (before, t_before), (step, t) in itertools.pairwise(written)
    if before > steps_per_epoch and step > before
  ]
  return {
    "start_s": written[0][1] - start,
    "steps_s": statistics.median(intervals) if intervals else float("nan"),
    "images_s": config.total_steps * config.batch_size / wall,
  }


def main(argv):
  del argv
  if _CIFAR_ROOT.value:
    os.environ["CIFAR10_ROOT"] = _CIFAR_ROOT.value
  if _HOST_ONLY.value:
    train.make_step_fn = reading_step_fn
  what = "host only (a step that reads its batch)" if _HOST_ONLY.value else "the row's step"
  print(f"{_ROW.value}, {what}: {_STEPS.value} steps per arm on {jax.devices()[0].device_kind}")
  print(f"{'split on':9} {'K':>2} {'start s':>8} {'steps/s':>9} {'img/s (run)':>12} {'vs host':>8}")
  for k in map(int, _DISPATCH.value):
    base = None
    for place in ("host", "device"):
      r = run_arm(place, k)
      base = base or r["steps_s"]
      print(
        f"{place:9} {k:>2} {r['start_s']:>8.1f} {r['steps_s']:>9.1f} {r['images_s']:>12,.0f} "
        f"{r['steps_s'] / base:>7.2f}x",
        flush=True,
      )


if __name__ == "__main__":
  app.run(main)
