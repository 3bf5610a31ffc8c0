"""Attention-centre plots (Cordonnier et al., Figs. 3, 4, 12, 14) and attention-probability grids
(Figs. 5-10), written as PNG files with matplotlib's Agg canvas (no pyplot, no global backend).

Centre plots: one panel per layer with Gaussian (quadratic) attention. For each head the
attention of a query is the Gaussian ``N(Delta, Sigma)`` of Eqs. 18-19 evaluated on the pixel
offsets ``delta = key - query``; the panel draws, per head and in its own colour, the contour that
encloses 50% of that Gaussian's mass (solid) and the one enclosing 90% (dotted), in a window of
offsets around the query token (black square). For a Gaussian, the region of highest density
holding mass ``m`` is ``{f >= (1 - m) f_max}``: ``gaussian_mass_levels``. ``mass_contour_levels``
finds the same levels numerically for any sampled density.

Probability grids: rows are layers, columns heads; each cell shows the attention probabilities of
one query pixel over a window of the image (averaged over the images given, as Fig. 6 averages
100 test images), the query boxed. Works for any model whose attention layers record
``attention`` intermediates (every layer of ``locvit.attention``).

Axes: x is the column offset ``d2``, y the row offset ``d1``, pointing down as in an image.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from locvit.analysis.locality import attention_centres
from locvit.attention.relative import inverse_covariance
from locvit.models.intermediates import apply_with_intermediates, collect_attention_maps
from locvit.models.surgery import attention_layers

DEFAULT_MASSES = (0.5, 0.9)
LINESTYLES = ("solid", "dotted", "dashed", "dashdot")


def gaussian_mass_levels(masses: Sequence[float] = DEFAULT_MASSES) -> np.ndarray:
  """Levels of ``f / f_max`` whose superlevel sets hold ``masses`` of a 2-D Gaussian (the 50% / 90%
  contours of Cordonnier et al. Figs. 3, 4, 12 and 14). Raises ValueError outside (0, 1).

  The Mahalanobis radius ``r`` enclosing mass ``m`` solves ``1 - exp(-r^2 / 2) = m``, and there
  ``f / f_max = exp(-r^2 / 2) = 1 - m``.
  """
  masses = np.asarray(masses, np.float64)
  if np.any((masses <= 0) | (masses >= 1)):
    raise ValueError(f"masses must lie in (0, 1), got {masses.tolist()}.")
  return 1.0 - masses


def mass_contour_levels(
  density: np.ndarray, masses: Sequence[float] = DEFAULT_MASSES
) -> np.ndarray:
  """Density levels whose superlevel sets ``{density >= level}`` hold ``masses`` of the total.

  Works on any non-negative sampled density (e.g. an attention map); the region is the highest
  density region, as plotted by contouring ``density`` at the returned levels.
  """
  values = np.sort(np.asarray(density, np.float64).ravel())[::-1]
  if values.size == 0 or values[0] <= 0:
    raise ValueError("density must have a positive entry.")
  cumulative = np.cumsum(values) / values.sum()
  masses = np.asarray(masses, np.float64)
  index = np.minimum(np.searchsorted(cumulative, masses), values.size - 1)
  return values[index]


def quadratic_heads(params: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """``{layer path: (centres (H, 2), Sigma^{-1} (H, 2, 2))}`` of every Gaussian attention layer
  (Cordonnier et al. Eq. 9 / appendix E parameters)."""
  out = {}
  for path, layer in attention_layers(params).items():
    pos = layer["positional"]
    if "attention_centers" not in pos:
      continue
    centers = np.asarray(pos["attention_centers"], np.float64)
    inv = np.asarray(inverse_covariance(jnp.asarray(pos["attention_spreads"])), np.float64)
    out[path] = (centers, inv)
  return out


def gpsa_heads(params: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """``{layer path: (centres (H', 2) as (row, col), Sigma^{-1} (H', 2, 2))}`` of every GPSA / PSA
  layer, in the format of ``quadratic_heads``.

  ConViT's positional logits ``w . (dx, dy, dx^2 + dy^2)`` equal ``-alpha ||delta - Delta||^2``
  up to a constant (ConViT Eq. 5), the Gaussian of Cordonnier et al. Eq. 9 with
  ``Sigma^{-1} = 2 alpha I``. Heads with ``alpha <= 0`` (the positional term prefers far keys)
  have no centre: NaN, so that every head keeps its index.
  """
  tree, _ = (params["params"], True) if "params" in params else (params, False)
  out = {}
  for path, kernel in traverse_util.flatten_dict(dict(tree), sep="/").items():
    if not path.endswith("pos_proj/kernel") or np.shape(kernel)[0] != 3:
      continue
    # (dx, dy) and span = 1 / alpha
    delta, span = (np.asarray(a, np.float64) for a in attention_centres(jnp.asarray(kernel)))
    local = (span > 0)[:, None]
    centers = np.where(local, delta[:, ::-1], np.nan)  # (dx, dy) -> (row, col) = (dy, dx)
    inv = np.where(local[:, :, None], (2.0 / span)[:, None, None] * np.eye(2), np.nan)
    out[path[: -len("/pos_proj/kernel")]] = (centers, inv)
  return out


def gaussian_heads(params: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """The Gaussian heads of every Cordonnier quadratic layer and every GPSA / PSA layer."""
  return {**quadratic_heads(params), **gpsa_heads(params)}


def gaussian_on_mesh(
  center: np.ndarray, inv_cov: np.ndarray, d1: np.ndarray, d2: np.ndarray
) -> np.ndarray:
  """Unnormalised ``exp(-1/2 (delta - Delta)^T Sigma^{-1} (delta - Delta))``, max 1 at ``Delta``.

  The Gaussian of Cordonnier et al. Eqs. 18-19 on the offset mesh ``(d1, d2)``.
  """
  e1, e2 = d1 - center[0], d2 - center[1]
  a, b, c = inv_cov[0, 0], inv_cov[0, 1], inv_cov[1, 1]
  return np.exp(-0.5 * (a * e1 * e1 + 2 * b * e1 * e2 + c * e2 * e2))


def _layer_label(path: str) -> str:
  match = re.search(r"(\d+)", path)
  return f"layer {int(match.group(1))}" if match else path


def _save(fig: Figure, path: str | os.PathLike) -> str:
  path = os.fspath(path)
  if os.path.dirname(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
  FigureCanvasAgg(fig)
  fig.savefig(path, format="png")
  return path


def note_outside(ax, centers: np.ndarray, half: float) -> list[int]:
  """Names, in the panel's lower left corner, the heads whose centre lies outside the window
  ``|offset| <= half`` (their contours and markers are cut off or absent) or that have none (a
  GPSA head preferring far keys, ``gpsa_heads``); returns them."""
  centers = np.asarray(centers)
  outside = [h for h, c in enumerate(centers) if not np.abs(c).max() <= half]  # NaN: no centre
  if outside:
    text = "\n".join(
      f"head {h} outside: row {centers[h][0]:+.1f}, col {centers[h][1]:+.1f}"
      if np.isfinite(centers[h]).all()
      else f"head {h}: no centre (prefers far keys)"
      for h in outside
    )
    ax.text(0.02, 0.02, text, transform=ax.transAxes, fontsize=5, va="bottom", ha="left",
            bbox=dict(facecolor="white", alpha=0.8, linewidth=0))  # fmt: skip
  return outside


def _query_box(ax, row: float, col: float) -> None:
  ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, facecolor="black", edgecolor="black"))


def plot_attention_centers(params: Any, path: str | os.PathLike, **kwargs: Any) -> str:
  """Writes ``attention_centers_figure(params, **kwargs)`` to ``path`` and returns the path."""
  return _save(attention_centers_figure(params, **kwargs), path)


def attention_centers_figure(
  params: Any,
  *,
  window: int = 11,
  masses: Sequence[float] = DEFAULT_MASSES,
  resolution: float = 0.05,
  ncols: int = 3,
  panel_size: float = 3.0,
  title: str = "",
) -> Figure:
  """The attention-centre plot of every Gaussian attention layer in ``params`` (Cordonnier et al.
  Figs. 3, 4, 12 and 14): offsets in tokens (a token is a pixel in the paper's figures, a patch
  or space-to-depth block here), each head in its own colour (legend), the query token black.

  Args:
    params: params (or variables) of a model with 'quadratic' / 'quadratic_generalized' or GPSA
      / PSA layers (ConViT, whose local init puts the heads on the kernel offsets, Eq. 5).
    window: side of the window of offsets around the query token (11 as in the paper).
    masses: mass fractions to contour (50% solid, 90% dotted, ...).
    resolution: mesh step in tokens for the contours.
    ncols, panel_size: layout.
    title: the figure's first title line (e.g. the model and step).
  """
  heads_by_layer = gaussian_heads(params)
  if not heads_by_layer:
    raise ValueError(
      "No Gaussian attention layers in these params; attention-centre plots need Cordonnier "
      "'attention_centers' / 'attention_spreads' or GPSA 'pos_proj' kernels. Use "
      "plot_attention_probabilities instead."
    )
  levels = gaussian_mass_levels(masses)
  order = np.argsort(levels)  # contour() wants increasing levels
  half = window / 2
  axis = np.arange(-half, half + resolution / 2, resolution)
  d1, d2 = np.meshgrid(axis, axis, indexing="ij")
  nrows = -(-len(heads_by_layer) // ncols)
  ncols = min(ncols, len(heads_by_layer))
  fig = Figure(figsize=(panel_size * ncols, panel_size * nrows), dpi=100)
  for index, (layer, (centers, inv)) in enumerate(heads_by_layer.items()):
    ax = fig.add_subplot(nrows, ncols, index + 1)
    for h in range(centers.shape[0]):
      color = f"C{h % 10}"
      ax.plot([], [], color=color, label=f"head {h}")  # the legend's entry, drawn or not
      if not np.isfinite(centers[h]).all():
        continue  # no centre (note_outside names it)
      density = gaussian_on_mesh(centers[h], inv[h], d1, d2)
      if density.max() < levels.min():
        continue  # centre outside the window: no contour inside it
      ax.contour(
        d2,
        d1,
        density,
        levels=levels[order],
        colors=[color],
        linestyles=[LINESTYLES[i % len(LINESTYLES)] for i in order],
      )
    _query_box(ax, 0.0, 0.0)
    note_outside(ax, centers, half)
    ax.set_xlim(-half, half)
    ax.set_ylim(half, -half)  # rows grow downwards
    ax.set_aspect("equal")
    ax.set_xticks(np.arange(-(window // 2), window // 2 + 1))
    ax.set_yticks(np.arange(-(window // 2), window // 2 + 1))
    ax.tick_params(labelsize=6)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.set_title(_layer_label(layer), fontsize=9)
    ax.set_xlabel("column offset (tokens)", fontsize=7)
    ax.set_ylabel("row offset (tokens)", fontsize=7)
  most = max(fig.axes, key=lambda ax: len(ax.get_lines()))  # a pruned layer has fewer heads
  most.legend(fontsize=5, loc="upper left", framealpha=0.7)
  contours = " / ".join(
    f"{int(m * 100)}% {LINESTYLES[i % len(LINESTYLES)]}" for i, m in enumerate(masses)
  )
  fig.suptitle(
    (f"{title}\n" if title else "") + f"{contours} mass contours; black: query token", fontsize=8
  )
  fig.tight_layout()
  return fig


def make_center_plotter(config: Any, params: Any, workdir: str) -> Callable[[int, Any], None]:
  """The trainer's hook: ``fn(step, params)`` writing ``workdir/plots/centers_step_NNNNNN.png``
  at each evaluation when ``config.analysis.center_plots``; a no-op otherwise or on processes
  > 0. Raises ValueError if the model has no Gaussian attention layers to plot."""
  analysis = config.analysis
  if analysis is None or not analysis.center_plots:
    return lambda step, params: None
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
  if not any("attention_centers" in p or "pos_proj" in p for p in paths):
    raise ValueError(
      f"analysis.center_plots=True needs Gaussian attention layers ('quadratic', "
      f"'quadratic_generalized', 'gpsa', 'psa'); model {config.model.name!r} has none."
    )

  def plot(step: int, params: Any) -> None:
    if jax.process_index() == 0:
      path = os.path.join(workdir, "plots", f"centers_step_{step:06d}.png")
      title = f"{config.model.name}, step {step}"
      plot_attention_centers(jax.device_get(params), path, title=title)

  return plot


def attention_maps(
  model: Any,
  variables: Any,
  images: jax.Array,
  query: tuple[int, int] | None = None,
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
  """Attention of one query token over the token grid, per layer and head, averaged over images.

  Returns ``(maps, grid_shape, query)`` with ``maps`` of shape ``(L, H, rows, cols)`` (layers
  with fewer heads are padded with NaN) and ``query`` the ``(row, col)`` used (default: centre).
  """
  found = list(
    collect_attention_maps(apply_with_intermediates(model, variables, images)[1]).items()
  )
  if not found:
    raise ValueError("The model recorded no attention maps ('.../attention' intermediates).")
  num_tokens = found[0][1].shape[-1]
  side = round(num_tokens**0.5)
  rows, cols = _grid_shape(model, images, num_tokens, side)
  query = (rows // 2, cols // 2) if query is None else tuple(query)
  if not (0 <= query[0] < rows and 0 <= query[1] < cols):
    raise ValueError(f"query={query} is outside the {rows}x{cols} token grid.")
  q = query[0] * cols + query[1]
  heads = max(v.shape[1] for _, v in found)
  maps = np.full((len(found), heads, rows, cols), np.nan)
  for i, (_, probs) in enumerate(found):
    mean = np.asarray(jnp.mean(probs[:, :, q, :], axis=0))  # (H, N), no prefix tokens
    maps[i, : mean.shape[0]] = mean[:, -rows * cols :].reshape(-1, rows, cols)
  return maps, (rows, cols), query


def _grid_shape(model: Any, images: jax.Array, num_tokens: int, side: int) -> tuple[int, int]:
  height, width = images.shape[1:3]
  for block in (getattr(model, "downsample", None), getattr(model, "patch_size", None)):
    if block and (height // block) * (width // block) == num_tokens:
      return height // block, width // block
  if side * side == num_tokens:
    return side, side
  raise ValueError(f"Cannot infer the token grid of {num_tokens} tokens.")


def plot_attention_grid(
  maps: np.ndarray,
  path: str | os.PathLike,
  *,
  query: tuple[int, int],
  window: int | None = 7,
  layer_labels: Sequence[str] | None = None,
  cell_size: float = 1.2,
) -> str:
  """Writes a layers x heads grid of attention maps ``(L, H, rows, cols)`` to ``path``.

  ``window``: side of the crop around ``query`` (7 as in Fig. 5; None shows the whole grid).
  """
  maps = np.asarray(maps)
  num_layers, num_heads, rows, cols = maps.shape
  r0, c0, r1, c1 = 0, 0, rows, cols
  if window is not None:
    half = window // 2
    r0, c0 = max(query[0] - half, 0), max(query[1] - half, 0)
    r1, c1 = min(query[0] + half + 1, rows), min(query[1] + half + 1, cols)
  fig = Figure(figsize=(cell_size * num_heads, cell_size * num_layers), dpi=100)
  for layer in range(num_layers):
    for head in range(num_heads):
      ax = fig.add_subplot(num_layers, num_heads, layer * num_heads + head + 1)
      ax.set_xticks([])
      ax.set_yticks([])
      crop = maps[layer, head, r0:r1, c0:c1]
      if not np.all(np.isnan(crop)):
        ax.imshow(
          crop,
          cmap="Blues",
          extent=(c0 - 0.5, c1 - 0.5, r1 - 0.5, r0 - 0.5),
          interpolation="nearest",
        )
        box = Rectangle(
          (query[1] - 0.5, query[0] - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.0
        )
        ax.add_patch(box)
      else:
        ax.axis("off")
      if head == 0:
        label = layer_labels[layer] if layer_labels else f"layer {layer}"
        ax.set_ylabel(label, fontsize=7)
      if layer == 0:
        ax.set_title(f"head {head}", fontsize=7)
  fig.tight_layout()
  return _save(fig, path)


def plot_attention_probabilities(
  model: Any,
  variables: Any,
  path: str | os.PathLike,
  *,
  images: jax.Array | None = None,
  image_size: int = 32,
  channels: int = 3,
  query: tuple[int, int] | None = None,
  window: int | None = 7,
) -> str:
  """Attention-probability grid (Cordonnier et al. Figs. 5-10) of ``model`` for one query, averaged
  over ``images``.

  Positional-only models do not depend on the images: with ``images=None`` one zero image of
  ``image_size`` is used. Content models need real images (Fig. 6 averages 100 test images).
  """
  if images is None:
    images = jnp.zeros((1, image_size, image_size, channels), jnp.float32)
  maps, _, query = attention_maps(model, variables, images, query)
  return plot_attention_grid(maps, path, query=query, window=window)
