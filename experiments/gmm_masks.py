"""Learned GMM and ELM masks of the reduced CIFAR-10 runs (Li & Zhang, Figs. 3-4) and the
parameter counts of the three models, from their final checkpoints.

  python experiments/gmm_masks.py --vit_workdir=RUN_V --elm_workdir=RUN_E \\
    --gmm_workdir=RUN_G [--layers=0,5] [--out_prefix=RUN_G/analysis/masks]

Writes ``<out_prefix>_{gmm,elm}_layer<i>.png`` (``locvit.analysis.masks.plot_mask_table``: per
head the raw 64 x 64 mask and its per-query unfolding) for the chosen layers, and prints
Markdown: parameter counts read from the checkpoints (total and mask parameters, per layer and in
all), and per GMM and ELM layer the mask at initialisation (the trainer's ``key(seed + 1)`` draw)
and at the end ("init / end"): its mean value at query-key distance 0, 1 and >= 4 tokens, its RMS
value, for GMM the number of "local" heads (query-averaged ``|M(d=1)| < |M(d=0)| / 2``), and the
Frobenius norm of the change relative to the initial mask (absolute for ELM, which starts at 0).
Each run's model is its own (``RUN/config.json``: overrides, class count); ``--config=FILE``
(``FILE:vit``, ``FILE:elm``, ``FILE:gmm``) replaces them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import flax
import jax.numpy as jnp
import numpy as np
from run_utils import (
  checkpoint_steps,
  image_shape,
  initial_params,
  load_config,
  params_at,
  run,
  run_num_classes,
)

from locvit.analysis.analyze import image_grid, model_label
from locvit.analysis.masks import collect_mask_tables, plot_mask_table
from locvit.attention.geometry import TokenGrid, squared_distances
from locvit.models import build_model


def final_params(spec: str | None, workdir: str):
  """``(config, model, params, step)`` of the last checkpoint of the run in ``workdir`` (its
  saved config, or config ``spec``)."""
  config = load_config(spec, workdir)
  model = build_model(config, run_num_classes(workdir))
  step = checkpoint_steps(workdir)[-1]
  return config, model, params_at(config, model, workdir, step), step


def count(tree) -> tuple[int, int]:
  """(all parameters, mask parameters) of a params tree."""
  flat = flax.traverse_util.flatten_dict(tree, sep="/")
  total = sum(int(np.size(v)) for v in flat.values())
  masks = sum(int(np.size(v)) for k, v in flat.items() if "/mask/" in k)
  return total, masks


def mask_tables(config, model, params) -> dict[str, np.ndarray]:
  """``{layer path: (H, N, N)}``; the masks do not depend on the image, one zero image suffices."""
  images = jnp.zeros((1, *image_shape(config)), jnp.float32)
  return collect_mask_tables(model, {"params": params}, images)


def distance_profile(table: np.ndarray, grid: TokenGrid) -> tuple[float, float, float]:
  """Mean mask value (over heads and query-key pairs) at distance 0, at distance 1 and at
  distances of 4 tokens or more."""
  d2 = squared_distances(grid)
  return tuple(float(table[:, sel].mean()) for sel in (d2 == 0, d2 == 1, d2 >= 16))


def local_heads(table: np.ndarray, grid: TokenGrid) -> int:
  """Heads whose query-averaged mask at distance 1 is below half of that at distance 0."""
  d2 = squared_distances(grid)
  at0 = np.abs(table[:, d2 == 0].mean(axis=1))
  at1 = np.abs(table[:, d2 == 1].mean(axis=1))
  return int(np.sum(at1 < 0.5 * at0))


def summary_table(name: str, start: dict, end: dict, grid: TokenGrid) -> str:
  """Per layer: the distance profile, the RMS value and (GMM) the local heads, at init and at the
  end, and the change relative to the initial mask."""
  per_head = name == "GMM"  # ELM shares one mask between the heads
  rows = [
    f"| {name} layer | M(d=0) | M(d=1) | M(d>=4) | RMS of M "
    + ("| local heads " if per_head else "")
    + "| change / init norm |",
    "|---" * (7 if per_head else 6) + "|",
  ]
  for i, path in enumerate(start):
    m0, m1 = start[path], end[path]
    pairs = [*zip(distance_profile(m0, grid), distance_profile(m1, grid), strict=True)]
    pairs.append((float(np.sqrt(np.mean(m0**2))), float(np.sqrt(np.mean(m1**2)))))
    cells = [f"{a:.3f} / {b:.3f}" for a, b in pairs]
    if per_head:
      cells.append(f"{local_heads(m0, grid)} / {local_heads(m1, grid)} of {m0.shape[0]}")
    norm0, change = np.linalg.norm(m0), np.linalg.norm(m1 - m0)
    cells.append(f"{change / norm0:.4f}" if norm0 else f"{change:.2f} (from 0)")
    rows.append(f"| {i} | " + " | ".join(cells) + " |")
  return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
  """Writes the mask figures and prints the counts and kernel summaries."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default=None, help="default: each run's WORKDIR/config.json")
  parser.add_argument("--vit_workdir", required=True)
  parser.add_argument("--elm_workdir", required=True)
  parser.add_argument("--gmm_workdir", required=True)
  parser.add_argument("--layers", default="0,5")
  # The docs' figures are written only when asked for by name.
  parser.add_argument("--out_prefix", default=None, help="default: GMM_WORKDIR/analysis/masks")
  args = parser.parse_args(argv)
  args.out_prefix = args.out_prefix or f"{args.gmm_workdir}/analysis/masks"
  layers = [int(i) for i in args.layers.split(",")]

  runs = {
    name: final_params(args.config and f"{args.config}:{name}", workdir)
    for name, workdir in (
      ("vit", args.vit_workdir),
      ("elm", args.elm_workdir),
      ("gmm", args.gmm_workdir),
    )
  }
  print("| model | step | parameters | mask parameters | per layer |\n|---|---|---|---|---|")
  for name, (_, _, params, step) in runs.items():
    total, masks = count(params)
    depth = len({key for key in params if key.startswith("blocks_")})
    print(f"| {name} | {step} | {total:,} | {masks:,} | {masks // depth:,} |")

  written = []
  for name in ("gmm", "elm"):
    config, model, params, step = runs[name]
    grid = image_grid(model, image_shape(config))[0]
    tables = mask_tables(config, model, params)
    paths = sorted(tables, key=lambda p: int(p.split("/")[0].split("_")[1]))
    if max(layers) >= len(paths):
      parser.error(f"--layers={args.layers}: {name}'s mask layers are 0-{len(paths) - 1}")
    for i in layers:
      title = f"{model_label(config)}, layer {i}, step {step}"
      out = f"{args.out_prefix}_{name}_layer{i}.png"
      written.append(plot_mask_table(tables[paths[i]], grid, out, title=title))
    start = mask_tables(config, model, initial_params(config, model))
    start, end = ({p: t[p] for p in paths} for t in (start, tables))
    print("\n" + summary_table(name.upper(), start, end, grid))
  for path in written:
    print(path)


if __name__ == "__main__":
  run(main)
