"""Step time of ``train_step`` alone and inside ``guarded_step`` (the non-finite guard).

  python benchmarks/nonfinite_guard.py [--repeats=5] [--steps=100]

Quickstart model and batch, one resident batch, the two jitted steps timed in interleaved repeats
so that machine load affects both alike. Prints the median and range in ms/step
(docs/reliability.md, "Cost per step").
"""

from __future__ import annotations

import functools
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from locvit import optim
from locvit.configs.quickstart import get_config
from locvit.models.factory import build_model
from locvit.platform import sharding
from locvit.run.state import TrainState
from locvit.run.step import guarded_step, initial_health, train_step

_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved repeats of each step.")
_STEPS = flags.DEFINE_integer("steps", 100, "Steps per timed repeat.")


def main(argv):
  del argv
  config = get_config()
  model = build_model(config, 10)
  params, _ = nn.meta.unbox(sharding.init_model_variables(model, (8, 8, 1), jax.random.key(0)))
  schedule = optim.make_schedule(config, 1000, 28)
  tx = optim.make_optimizer(config, params, schedule)
  state = TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))
  rng = np.random.default_rng(0)
  batch = {
    "image": jnp.asarray(rng.random((config.batch_size, 8, 8, 1)), jnp.float32),
    "label": jnp.arange(config.batch_size) % 10,
  }
  kwargs = dict(model=model, tx=tx, schedule=schedule, config=config, num_classes=10)
  plain = jax.jit(functools.partial(train_step, **kwargs))
  guarded = jax.jit(functools.partial(guarded_step, **kwargs))
  steps = {
    "train_step": lambda s, h: (plain(s, batch)[0], h),
    "guarded_step": lambda s, h: guarded(s, batch, (), h)[::2],
  }
  for step in steps.values():  # compile
    jax.block_until_ready(step(state, initial_health()))
  times = {name: [] for name in steps}
  for _ in range(_REPEATS.value):
    for name, step in steps.items():
      s, h = state, initial_health()
      start = time.perf_counter()
      for _ in range(_STEPS.value):
        s, h = step(s, h)
      jax.block_until_ready((s, h))
      times[name].append((time.perf_counter() - start) / _STEPS.value * 1e3)
  for name, t in times.items():
    print(f"{name}: median {np.median(t):.1f} ms/step ({min(t):.1f}-{max(t):.1f})", flush=True)


if __name__ == "__main__":
  app.run(main)
