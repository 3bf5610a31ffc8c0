"""Attention centres of a quadratic SA run over training (Cordonnier et al., Fig. 3), from its
checkpoints, plus the numbers that say whether the centres formed a grid around the query.

  python experiments/cordonnier_centers.py --workdir=RUN [--out_prefix=RUN/analysis/cordonnier]

Writes ``<out_prefix>_centers.png`` (rows: steps, columns: layers; per head its 50% mass contour
and its centre, the query token in black), ``<out_prefix>_center_paths.png`` (per layer, every
head's centre from initialisation (open circle) through each checkpoint to the last (filled)) and
``<out_prefix>_final.png`` (``locvit.analysis.centers.plot_attention_centers`` of the last step,
the paper's Fig. 3 layout), and prints a Markdown table per step and layer: mean distance of the
centres to the query, mean distance to the nearest integer offset, the number of distinct integer
offsets the centres round to, how many of the 9 taps of a 3x3 kernel around the query some
centre rounds to, the mean inverse spread ``s`` (``Sigma^{-1} = s^2 I``) and the
mean and largest distance each centre moved since step 0.

The model is the run's own (``RUN/config.json``: its overrides and class count; ``--config=FILE``
replaces it). Step 0 is rebuilt as the trainer draws it (``model.init`` with ``key(seed + 1)``;
the trainer saves no step-0 checkpoint). Offsets are in tokens of the model's grid (4x4-pixel
blocks for the reduced config). Run it as a single process, after the run has finished.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from run_utils import checkpoint_steps, initial_params, load_config, params_at, run, run_num_classes

from locvit.analysis import centers as centers_lib
from locvit.analysis.analyze import model_label
from locvit.models import build_model

HALF_MASS_LEVEL = float(centers_lib.gaussian_mass_levels((0.5,))[0])


def params_by_step(config, workdir: str) -> dict[int, dict]:
  """``{step: params}`` for step 0 and every checkpoint kept in ``workdir/checkpoints``."""
  model = build_model(config, run_num_classes(workdir))
  out = {0: initial_params(config, model)}
  for step in checkpoint_steps(workdir):
    out[step] = params_at(config, model, workdir, step)
  return out


def centre_statistics(centers: np.ndarray, spreads: np.ndarray) -> dict[str, float]:
  """Distance to the query and to the nearest integer offset, distinct rounded offsets, 3x3 taps
  covered, spread."""
  rounded = np.round(centers)
  return {
    "dist_query": float(np.linalg.norm(centers, axis=-1).mean()),
    "dist_lattice": float(np.linalg.norm(centers - rounded, axis=-1).mean()),
    "distinct": len({tuple(r) for r in rounded.astype(int).tolist()}),
    # Taps of a 3x3 kernel around the query that some head's rounded centre lands on.
    "taps3x3": len({tuple(r) for r in rounded.astype(int).tolist() if max(map(abs, r)) <= 1}),
    "spread": float(np.abs(spreads).mean()),
  }


def layer_tables(params) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """``{layer: (centres (H, 2), spreads (H,))}`` of every quadratic layer."""
  out = {}
  for path, (centers, _) in centers_lib.quadratic_heads(params).items():
    layer = params
    for key in path.split("/"):
      layer = layer[key]
    out[path] = (centers, np.asarray(layer["positional"]["attention_spreads"], np.float64))
  return out


def _panel(ax, window: int) -> None:
  """Query token, equal axes, rows growing downwards, integer ticks."""
  half = window / 2
  ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, facecolor="black"))
  ax.set_xlim(-half, half)
  ax.set_ylim(half, -half)  # rows grow downwards, as in an image
  ax.set_aspect("equal")
  ticks = np.arange(-(window // 2), window // 2 + 1)
  ax.set_xticks(ticks)
  ax.set_yticks(ticks)
  ax.tick_params(labelsize=5)
  ax.grid(True, linewidth=0.3, alpha=0.5)


def _save(fig: Figure, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  FigureCanvasAgg(fig)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  return path


def contour_figure(
  tables: dict[int, dict], steps: Sequence[int], window: int, label: str = ""
) -> Figure:
  """Rows: steps; columns: layers; per head its 50% mass contour and its centre."""
  layers = list(tables[steps[0]])
  axis = np.arange(-window / 2, window / 2 + 0.025, 0.05)
  d1, d2 = np.meshgrid(axis, axis, indexing="ij")
  fig = Figure(figsize=(1.9 * len(layers), 2.0 * len(steps)))
  axes = fig.subplots(len(steps), len(layers), squeeze=False)
  for r, step in enumerate(steps):
    for col, layer in enumerate(layers):
      ax = axes[r, col]
      centers, spreads = tables[step][layer]
      for h, (center, s) in enumerate(zip(centers, spreads, strict=True)):
        inv = (s**2) * np.eye(2)
        density = centers_lib.gaussian_on_mesh(center, inv, d1, d2)
        if density.max() >= HALF_MASS_LEVEL:
          ax.contour(d2, d1, density, levels=[HALF_MASS_LEVEL], colors=[f"C{h}"], linewidths=0.8)
        ax.plot(center[1], center[0], "o", color=f"C{h}", markersize=2.5)
      centers_lib.note_outside(ax, centers, window / 2)
      _panel(ax, window)
      if r == 0:
        ax.set_title(f"layer {col}", fontsize=8)
      if col == 0:
        ax.set_ylabel(f"step {step}", fontsize=8)
  fig.suptitle(
    f"{label}: quadratic heads' 50% mass contours and centres (offsets in tokens)", fontsize=9
  )
  return fig


def path_figure(tables: dict[int, dict], window: int, label: str = "") -> Figure:
  """Per layer, each head's centre over the checkpoints: open circle at 0, filled at the end."""
  steps = sorted(tables)
  layers = list(tables[steps[0]])
  fig = Figure(figsize=(2.3 * len(layers), 2.5))
  axes = fig.subplots(1, len(layers), squeeze=False)[0]
  for ax, layer in zip(axes, layers, strict=True):
    track = np.stack([tables[s][layer][0] for s in steps])  # (T, H, 2)
    for h in range(track.shape[1]):
      ax.plot(track[:, h, 1], track[:, h, 0], "-", color=f"C{h}", linewidth=0.8)
      ax.plot(track[0, h, 1], track[0, h, 0], "o", mfc="none", color=f"C{h}", markersize=3)
      ax.plot(track[-1, h, 1], track[-1, h, 0], "o", color=f"C{h}", markersize=3.5)
    centers_lib.note_outside(ax, track[-1], window / 2)
    _panel(ax, window)
    ax.set_title(f"layer {layers.index(layer)}", fontsize=8)
  fig.suptitle(
    f"{label}: centre paths, steps {steps[0]} (open) to {steps[-1]} (filled)", fontsize=9
  )
  return fig


def markdown_table(tables: dict[int, dict]) -> str:
  """One row per step and layer: ``centre_statistics`` and the displacement since step 0."""
  rows = [
    "| step | layer | mean |Delta| | mean dist. to lattice | distinct offsets | mean s "
    "| 3x3 taps covered | mean / max displacement from step 0 |",
    "|---|---|---|---|---|---|---|---|",
  ]
  first = tables[min(tables)]
  for step in sorted(tables):
    for i, (layer, (centers, spreads)) in enumerate(tables[step].items()):
      st = centre_statistics(centers, spreads)
      moved = np.linalg.norm(centers - first[layer][0], axis=-1)
      rows.append(
        f"| {step} | {i} | {st['dist_query']:.2f} | {st['dist_lattice']:.2f} | "
        f"{st['distinct']}/{len(centers)} | {st['spread']:.2f} | {st['taps3x3']}/9 | "
        f"{moved.mean():.3f} / {moved.max():.3f} |"
      )
  return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
  """Writes the figures and prints the table (see the module docstring)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default=None, help="default: the run's WORKDIR/config.json")
  parser.add_argument("--workdir", required=True, help="the run's --workdir")
  # The docs' figures are written only when asked for by name.
  parser.add_argument("--out_prefix", default=None, help="default: WORKDIR/analysis/cordonnier")
  parser.add_argument("--plot_steps", default="", help="comma-separated; default 4 spread steps")
  parser.add_argument("--window", type=int, default=7, help="side of the offset window, tokens")
  args = parser.parse_args(argv)
  args.out_prefix = args.out_prefix or f"{args.workdir}/analysis/cordonnier"

  config = load_config(args.config, args.workdir)
  params = params_by_step(config, args.workdir)
  tables = {step: layer_tables(p) for step, p in params.items()}
  if not tables[0]:
    raise ValueError(f"{config.model.name} has no quadratic attention layers to plot.")
  steps = sorted(tables)
  if args.plot_steps:
    plot_steps = [int(s) for s in args.plot_steps.split(",")]
    missing = sorted(set(plot_steps) - set(steps))
    if missing:
      raise ValueError(f"--plot_steps {missing} have no checkpoint; available: {steps}.")
  else:
    plot_steps = sorted({steps[round(i * (len(steps) - 1) / 3)] for i in range(4)})
  label = model_label(config)
  contours = contour_figure(tables, plot_steps, args.window, label)
  paths = [
    _save(contours, f"{args.out_prefix}_centers.png"),
    _save(path_figure(tables, args.window, label), f"{args.out_prefix}_center_paths.png"),
    centers_lib.plot_attention_centers(
      params[steps[-1]],
      f"{args.out_prefix}_final.png",
      window=args.window,
      title=f"{label}, step {steps[-1]}",
    ),
  ]
  print(markdown_table(tables))
  for path in paths:
    print(path)


if __name__ == "__main__":
  run(main)
