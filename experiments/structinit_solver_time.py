"""Times the impulse-initialization solve (Zheng, Li, Lucey, Algorithm 1) for the model of a
structured-init config: compilation and run separately, no cache, in 'same' and 'different' mode.

  python experiments/structinit_solver_time.py [--config=configs/structinit_cifar10_small.py]
    [--seeds=0,1] [--modes=same,different]

Prints a Markdown table: mode, seed, solves, compile seconds, solve seconds, final loss (Eq. 8)
and the mean fraction of queries whose attention argmax is the impulse target. The trainer logs
the solve seconds of its own run (``Impulse init (..., X.Xs)``); this adds the compilation.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
from run_utils import load_config, run

from locvit.init import apply as init_apply
from locvit.init.impulse import solve_impulse, solver_config
from locvit.models import create_model


def main(argv: Sequence[str] | None = None) -> None:
  """Prints the solver timings (see the module docstring)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/structinit_cifar10_small.py:impulse3")
  parser.add_argument("--seeds", default="0,1")
  parser.add_argument("--modes", default="same,different")
  args = parser.parse_args(argv)

  config = load_config(args.config)
  if config.init.name != "impulse":
    raise ValueError(f"{args.config} uses init {config.init.name!r}; choose an impulse variant.")
  model = create_model(config.model.name, 10, **config.model.overrides.to_dict())
  grid = init_apply.token_grid(model, config.data.image_size)
  dim, heads, depth = model.embed_dim, model.num_heads, model.depth
  head_dim = model.head_dim or dim // heads
  print(f"{config.model.name}, patch {model.patch_size}: {grid}, D={dim}, H={heads}, L={depth}")
  print("| mode | seed | solves | compile s | solve s | loss | argmax fraction |")
  print("|---|---|---|---|---|---|---|")
  for mode in args.modes.split(","):
    cfg = solver_config(config.init, mode=mode)
    for seed in (int(s) for s in args.seeds.split(",")):
      sol = solve_impulse(cfg, grid, dim, heads, head_dim, depth=depth, seed=seed, cache_dir=None)
      print(
        f"| {mode} | {seed} | {len(sol.loss)} | {sol.compile_seconds:.1f} | "
        f"{sol.solve_seconds:.1f} | {np.mean(sol.loss):.3e} | {np.mean(sol.argmax_fraction):.3f} |"
      )


if __name__ == "__main__":
  run(main)
