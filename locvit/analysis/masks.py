"""Plots of learned GMM / ELM masks, unfolded per query as in Li & Zhang Figs. 3 and 4.

A mask table ``M`` of shape ``(N, N)`` on an ``h x w`` token grid is shown two ways:

- as the raw ``N x N`` matrix (Fig. 3 left);
- unfolded per query (Fig. 3 right, Fig. 4): query ``(r, c)`` owns the ``h x w`` tile at tile-row
  ``r``, tile-column ``c`` of an ``(h * h) x (w * w)`` image, and that tile is ``M[query, :]``
  laid out on the grid -- the "convolution kernel" the mask applies around that query.

Tables come from any backbone through ``collect_mask_tables`` (the mask modules sow their
``(H, N, N)`` table as the ``.../mask/table`` intermediate), so this works on ViT, Swin windows,
CaiT, PiT stages and T2T alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from locvit.attention.geometry import TokenGrid, grid_from_tokens

TABLE_SUFFIX = "/table"
COLOUR_BAR_LABEL = "mask value (shared by all panels)"


def unfold_mask(table: Any, grid: TokenGrid) -> np.ndarray:
  """``(N, N)`` -> ``(h * h, w * w)``: each query's row laid out on the grid, tiled by query."""
  table = np.asarray(table)
  n = grid.num_tokens
  if table.shape != (n, n):
    raise ValueError(f"Mask table of shape {table.shape} does not match the {n}-token grid {grid}.")
  h, w = grid.height, grid.width
  # (qr, qc, kr, kc) -> (qr, kr, qc, kc): tile (qr, qc) holds keys (kr, kc).
  return table.reshape(h, w, h, w).transpose(0, 2, 1, 3).reshape(h * h, w * w)


def collect_mask_tables(model: Any, variables: Any, images: Any) -> dict[str, np.ndarray]:
  """Runs ``model`` once (jitted, eval mode) and returns ``{module path: (H, N, N) table}``."""
  import jax

  from locvit.models.intermediates import apply_with_intermediates

  _, inter = jax.jit(lambda v, x: apply_with_intermediates(model, v, x))(variables, images)
  return {
    path[: -len(TABLE_SUFFIX)]: np.asarray(value)
    for path, value in inter.items()
    if path.endswith(TABLE_SUFFIX)
  }


def _heads_to_plot(table: np.ndarray) -> np.ndarray:
  """ELM tables are shared by the heads: plot one column instead of H identical ones."""
  if table.shape[0] > 1 and np.all(table == table[:1]):
    return table[:1]
  return table


def mask_table_figure(table: Any, grid: TokenGrid, *, title: str = "") -> Any:
  """One layer's masks: per head, the raw mask (top) and its unfolding (bottom), every panel on
  one colour scale, drawn as a colour bar (a flat mask looks flat beside a local one)."""
  # A bare Figure on the Agg canvas: no pyplot, so a notebook's backend is left alone.
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  from locvit.analysis.plots import shared_colour_bar, shared_norm

  table = _heads_to_plot(np.asarray(table, np.float32))
  heads = table.shape[0]
  fig = Figure(figsize=(2.4 * heads + 1.0, 5.0), layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(2, heads, squeeze=False)
  norm = shared_norm([table])
  for h in range(heads):
    for row, image in enumerate((table[h], unfold_mask(table[h], grid))):
      ax = axes[row, h]
      ax.imshow(image, cmap="viridis", norm=norm, interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
    axes[0, h].set_title(f"head {h}" if heads > 1 else "all heads", fontsize=8)
  axes[0, 0].set_ylabel("mask (query x key)", fontsize=8)
  axes[1, 0].set_ylabel("per query (its keys on the grid)", fontsize=8)
  shared_colour_bar(fig, axes, norm, COLOUR_BAR_LABEL, [table], shrink=0.8, fontsize=8)
  fig.suptitle(title, fontsize=9)
  return fig


def plot_mask_table(
  table: Any, grid: TokenGrid, path: str | os.PathLike, *, title: str = ""
) -> Path:
  """Writes ``mask_table_figure`` of one layer to ``path``."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  mask_table_figure(table, grid, title=title).savefig(path, dpi=100)
  return path


def plot_mask_tables(
  tables: Mapping[str, Any],
  out_dir: str | os.PathLike,
  *,
  grids: Mapping[str, TokenGrid] | None = None,
) -> list[Path]:
  """Writes ``out_dir/<layer path with '/' -> '_'>.png`` for every ``(H, N, N)`` table.

  ``grids`` gives a layer's token grid; by default it is the square grid of ``N`` tokens.
  """
  written = []
  for name, table in tables.items():
    table = np.asarray(table)
    if table.ndim != 3 or table.shape[1] != table.shape[2]:
      raise ValueError(f"Mask table {name!r} has shape {table.shape}; expected (H, N, N).")
    grid = (grids or {}).get(name) or grid_from_tokens(table.shape[-1])
    filename = name.replace("/", "_") + ".png"
    written.append(plot_mask_table(table, grid, Path(out_dir) / filename, title=name))
  return written
