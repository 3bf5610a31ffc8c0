"""Step time of ``locvit.run.step``'s ``train_step`` alone and inside ``guarded_steps`` (the
non-finite guard), as ``kit.state_and_step`` builds them.

  python benchmarks/nonfinite_guard.py [--repeats=5] [--steps=100]

Quickstart model and batch, one resident batch, the two jitted steps timed in interleaved repeats
so that machine load affects both alike. Prints the median and range in ms/step
(docs/reliability.md, "Cost per step").
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import kit
import numpy as np
from absl import app, flags

from locvit.configs.quickstart import get_config
from locvit.run import step as step_lib

_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved repeats of each step.")
_STEPS = flags.DEFINE_integer("steps", 100, "Steps per timed repeat.")


def main(argv):
  del argv
  config = get_config()
  rng = np.random.default_rng(0)
  batch = {
    "image": jnp.asarray(rng.random((config.batch_size, 8, 8, 1)), jnp.float32),
    "label": jnp.arange(config.batch_size) % 10,
  }
  # Not donated: every repeat starts from the same state.
  state, plain = kit.state_and_step(config, (8, 8, 1), 10, donate=False)
  _, guarded = kit.state_and_step(config, (8, 8, 1), 10, state, loop=True, donate=False)
  steps = {
    "train_step": lambda s, h: (plain(s, batch)[0], h),
    "guarded_step": lambda s, h: guarded(s, [batch], (), h)[::2],
  }
  for step in steps.values():  # compile
    jax.block_until_ready(step(state, step_lib.initial_health()))
  times = {name: [] for name in steps}
  for _ in range(_REPEATS.value):
    for name, step in steps.items():
      s, h = state, step_lib.initial_health()
      start = time.perf_counter()
      for _ in range(_STEPS.value):
        s, h = step(s, h)
      jax.block_until_ready((s, h))
      times[name].append((time.perf_counter() - start) / _STEPS.value * 1e3)
  for name, t in times.items():
    print(f"{name}: median {np.median(t):.1f} ms/step ({min(t):.1f}-{max(t):.1f})", flush=True)


if __name__ == "__main__":
  app.run(main)
