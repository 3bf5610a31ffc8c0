"""Does bounding how far the host runs ahead of the device (``locvit.run.cadence.RunAhead``, 2
steps) slow the training step? The quickstart's loop body (next batch, device transfer, jitted step)
timed with and without the bound, side by side.

  python benchmarks/run_ahead.py [--repeats=5] [--steps=100]

Builds the run as ``locvit.main`` does (in a temporary workdir, CPU, the devices JAX sees), then
times ``--steps`` steps per repeat for each variant, interleaved so that machine load affects both
alike. Prints the median ms/step of each and the ratio bounded / unbounded (docs/reliability.md,
"Cost per step").
"""

from __future__ import annotations

import contextlib
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np
from absl import app, flags

from locvit import train
from locvit.configs import quickstart
from locvit.platform import sharding
from locvit.run import bundle, cadence
from locvit.run.step import initial_health

_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved repeats of each variant.")
_STEPS = flags.DEFINE_integer("steps", 100, "Steps per timed repeat.")


def main(argv):
  del argv
  config = quickstart.get_config()
  variants = {"unbounded": None, "bounded (2 steps)": 2}
  times = {name: [] for name in variants}
  with (
    tempfile.TemporaryDirectory() as workdir,
    bundle.build_training(config, workdir) as run,
    jax.set_mesh(run.mesh),
    nn.logical_axis_rules(run.rules),
  ):
    _, state = train.restore_or_initialise(run)
    step_fn = train.make_step_fn(run)
    health = jax.device_put(initial_health(), sharding.replicated(run.mesh))
    with contextlib.closing(run.train_batches(0)) as batches:

      def steps(state, health, limit):
        run_ahead = cadence.RunAhead(limit)
        for _ in range(_STEPS.value):
          batch = sharding.global_batch(next(batches), run.batch_sharding)
          run_ahead.wait()
          state, metrics, health = step_fn(state, [batch], (), health)
          run_ahead.dispatched(metrics)
        return jax.block_until_ready((state, health))

      state, health = steps(state, health, None)  # compile, warm the input pipeline
      for _ in range(_REPEATS.value):
        for name, limit in variants.items():
          start = time.perf_counter()
          state, health = steps(state, health, limit)
          times[name].append((time.perf_counter() - start) / _STEPS.value * 1e3)
  medians = {name: float(np.median(t)) for name, t in times.items()}
  for name, t in times.items():
    print(f"{name:18s} median {medians[name]:.2f} ms/step ({min(t):.2f}-{max(t):.2f})")
  ratio = medians["bounded (2 steps)"] / medians["unbounded"]
  print(f"ratio bounded / unbounded: {ratio:.3f} ({jax.device_count()} {jax.default_backend()})")


if __name__ == "__main__":
  app.run(main)
