"""ConViT figures with matplotlib's object API and the Agg canvas (no pyplot, no global state).

- :func:`training_curves_figure`: loss, and top-1/top-5 in %, over training (train and eval, EMA
  too, and the results of ``--mode=eval``).
- :func:`nonlocality_figure`: nonlocality of each layer over training (paper Fig. 5).
- :func:`gate_figure`: ``sigmoid(lambda_h)`` of every head of every GPSA layer over training,
  with the head mean in black (Fig. 6).
- :func:`attention_maps_figure`: one query patch's attention for every head of chosen layers,
  on one logarithmic colour scale shared by every panel (with its colour bar), each head's gate
  in its title on a white-to-red background (Fig. 7).
- :func:`shared_norm`, :func:`shared_colour_bar`: one colour scale for every panel of a figure,
  drawn as one colour bar (here, and in ``init_maps`` and ``masks``' figures).

Layers are labelled from 0, like the parameters (``blocks_i``); the paper counts from 1.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib import cm, colormaps, colors, patches
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colorbar import Colorbar
from matplotlib.figure import Figure

from locvit.attention import TokenGrid
from locvit.workdir import paths


def save(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> str:
  """Renders ``fig`` to a PNG at ``path`` (a local path or a bucket URI; directories are created)
  and returns the path."""
  target = paths.path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  FigureCanvasAgg(fig)
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=dpi, bbox_inches="tight")
  target.write_bytes(png.getvalue())
  return os.fspath(target)


NO_EVALUATION = "no evaluation yet"
MODE_EVAL = "--mode=eval"  # in the names of the series of --mode=eval results (eval.jsonl)


def _note(ax, text: str) -> None:
  """``text`` in the middle of ``ax``: what the panel does not show yet, and why."""
  ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.35")


def training_curves_figure(
  series: Mapping[str, tuple[np.ndarray, np.ndarray]], *, title: str = ""
) -> Figure:
  """Two panels from series ``{key: (steps, values)}``: the ``*/loss`` keys on the left, the
  ``*/top1`` and ``*/top5`` keys as percentages (a 0-100 axis) on the right. Keys naming
  ``--mode=eval`` are separate evaluations, drawn as crosses; a series of one point is one
  marker of the same size whatever its key; top-5's markers are rings, so a top-1 point equal
  to it (both 0 or 100%) shows inside; an accuracy panel without series says there is no
  evaluation yet."""
  fig = Figure(figsize=(10, 4))
  loss_ax, accuracy_ax = fig.subplots(1, 2, sharex=True)
  for key in sorted(series):
    steps, values = series[key]
    metric, separate, one_point = key.split(" ")[0], MODE_EVAL in key, len(steps) == 1
    style = dict(
      linestyle="none" if separate or one_point else "-",
      marker="x" if separate else "o" if one_point else "" if key.startswith("train/") else ".",
    )
    if metric.endswith("/top5") and not separate:
      style.update(marker="o", markerfacecolor="none", markersize=7)
    ax, scale = (loss_ax, 1) if metric.endswith("/loss") else (accuracy_ax, 100)
    ax.plot(steps, scale * np.asarray(values), label=key, **style)
  loss_ax.set_ylabel("loss")
  _plain_values(loss_ax)
  accuracy_ax.set_ylabel("accuracy (%)")
  accuracy_ax.set_ylim(0, 100)
  if not accuracy_ax.get_lines():
    _note(accuracy_ax, f"{NO_EVALUATION}\n({MODE_EVAL} adds one)")
  for ax in (loss_ax, accuracy_ax):
    ax.set_xlabel("step")
    if ax.get_lines():
      ax.legend(fontsize="small")
  fig.suptitle(title or "Training curves")
  return fig


# The nonlocality axis spans at least this many patches: changes in the 5th decimal (a few steps
# of training) are drawn flat, not stretched over the axis.
NONLOCALITY_MIN_SPAN = 0.1


def _plain_values(ax, min_span: float = 0.0) -> None:
  """The y ticks as the values themselves (no '1e-5+4.1364' offset), over at least ``min_span``
  around the data's middle."""
  ax.ticklabel_format(axis="y", useOffset=False, style="plain")
  low, high = ax.get_ylim()
  if high - low < min_span:
    middle = (low + high) / 2
    ax.set_ylim(middle - min_span / 2, middle + min_span / 2)


def _layer_colours(layers: Sequence[int]) -> dict[int, tuple]:
  cmap = colormaps["viridis"]
  span = max(len(layers) - 1, 1)
  return {layer: cmap(i / span) for i, layer in enumerate(sorted(layers))}


def nonlocality_figure(
  x: np.ndarray,
  series: Mapping[int, np.ndarray],
  *,
  xlabel: str = "step",
  title: str = "",
  note: str | None = None,
) -> Figure:
  """Fig. 5: one line per layer, the head-averaged nonlocality (Eq. 8) at each logged point;
  ``note`` is written across the axes (e.g. that only the initialisation is logged yet)."""
  if not series:
    raise ValueError("No nonlocality series to plot.")
  fig = Figure(figsize=(5.5, 4))
  ax = fig.add_subplot()
  palette = _layer_colours(list(series))
  for layer in sorted(series):
    ax.plot(x, series[layer], color=palette[layer], label=f"layer {layer}", marker=".")
  ax.set_xlabel(xlabel)
  ax.set_ylabel("nonlocality (patches)")
  _plain_values(ax, min_span=NONLOCALITY_MIN_SPAN)
  ax.set_title(title or "Nonlocality (Eq. 8)")
  ax.legend(fontsize="small", ncol=2)
  if note:
    _note(ax, note)
  return fig


def gate_figure(
  x: np.ndarray,
  gates: Mapping[int, np.ndarray],
  *,
  xlabel: str = "step",
  title: str = "",
  note: str | None = None,
) -> Figure:
  """Fig. 6: per GPSA layer, ``sigmoid(lambda_h)`` of each head (colours) and their mean (black),
  a marker at each logged point.

  ``gates[layer]`` is ``(T, H)`` for the T logged points; ``title`` (the model) and ``note`` are
  written above the panels.
  """
  if not gates:
    raise ValueError("No gate series to plot (the model has no GPSA layer, or none was logged).")
  layers = sorted(gates)
  cols = min(len(layers), 5)
  rows = -(-len(layers) // cols)
  fig = Figure(figsize=(2.6 * cols, 2.3 * rows))
  axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
  for ax, layer in zip(axes.flat, layers, strict=False):
    values = np.asarray(gates[layer])
    for h in range(values.shape[1]):
      colour = colormaps["tab10"](h % 10)
      ax.plot(x, values[:, h], lw=1, marker=".", color=colour, label=f"head {h}")
    ax.plot(x, values.mean(axis=1), lw=2, marker=".", color="black", label="mean")
    ax.set_ylim(0, 1)
    ax.set_title(f"layer {layer}")
  for ax in axes.flat[len(layers) :]:
    ax.set_visible(False)
  for ax in axes[-1]:
    ax.set_xlabel(xlabel)
  for ax in axes[:, 0]:
    ax.set_ylabel(r"$\sigma(\lambda_h)$")
  axes.flat[0].legend(fontsize="x-small")
  heading = "\n".join(text for text in (title or "GPSA gates (Fig. 6)", note) if text)
  fig.suptitle(heading, y=1.0, va="bottom")  # above the panels' titles
  return fig


def head_title(head: int, gate: float | None) -> str:
  """``'head 2'`` or ``'head 2  g=0.73'`` (the gate ``sigmoid(lambda)`` of a GPSA head)."""
  return f"head {head}" if gate is None else f"head {head}  g={gate:.2f}"


# The shared colour scale of the attention maps spans at most this many decades below the
# largest weight; smaller weights are drawn in the lowest colour and the colour bar says so.
MAP_DECADES = 4
# Over the patches: a class token's share is left out and each row renormalised (query_maps).
MAP_COLOURBAR_LABEL = "attention weight over the patches\n(log scale shared by all panels)"


def shared_norm(
  values: Sequence[np.ndarray], *, vmin: float | None = None, decades: int | None = None
) -> colors.Normalize:
  """One colour scale for every panel's ``values`` (a flat panel then looks flat beside a peaked
  one): linear from their minimum, or from ``vmin``, to their maximum; with ``decades``,
  logarithmic, its lower end at most ``decades`` below the maximum (smaller values clipped)."""
  top = max(float(np.max(v)) for v in values)
  bottom = min(float(np.min(v)) for v in values) if vmin is None else vmin
  if decades is None:
    return colors.Normalize(vmin=bottom, vmax=top)
  return colors.LogNorm(vmin=max(bottom, top * 10.0**-decades), vmax=top)


def shared_colour_bar(
  fig: Figure,
  axes: np.ndarray,
  norm: colors.Normalize,
  label: str,
  values: Sequence[np.ndarray],
  *,
  shrink: float = 1.0,
  fontsize: float | None = None,
) -> Colorbar:
  """``norm`` (viridis, as the panels) drawn as one colour bar beside ``axes``, the panels that
  share it. Where ``values`` lie below the scale (drawn in the lowest colour), the bar's lower end
  is an arrow and its label says where the scale stops."""
  clipped = min(float(np.min(v)) for v in values) < norm.vmin
  mappable = cm.ScalarMappable(norm=norm, cmap="viridis")
  bar = fig.colorbar(mappable, ax=axes, shrink=shrink, extend="min" if clipped else "neither")
  clip_note = f"\n(below {norm.vmin:.1e}: lowest colour)" if clipped else ""
  bar.set_label(label + clip_note, **({} if fontsize is None else {"fontsize": fontsize}))
  return bar


def attention_maps_figure(
  image: np.ndarray,
  grid: TokenGrid,
  query: tuple[int, int],
  maps: Mapping[int, np.ndarray],
  gates: Mapping[int, np.ndarray | None],
  *,
  patch_size: int,
) -> Figure:
  """Fig. 7: the input with the query patch boxed in red, then one row of heads per layer.

  Every panel shares one logarithmic colour scale (``shared_norm``), drawn as a colour bar,
  so that a nearly uniform head looks uniform beside a local one.

  Args:
    image: ``(H, W, C)`` image in [0, 1] for display.
    grid: the patch grid; ``query`` is its ``(row, col)``.
    maps: ``{layer: (heads, grid.height, grid.width)}`` attention of the query patch.
    gates: ``{layer: (heads,) or None}``; a gate is printed in the title, on a background from
      white (content) to red (position).
    patch_size: pixels per patch side (the query's box on the image).
  """
  layers = sorted(maps)
  heads = max(np.asarray(maps[layer]).shape[0] for layer in layers)
  fig = Figure(figsize=(2.0 * (heads + 1) + 0.8, 2.2 * len(layers)))
  axes = fig.subplots(len(layers), heads + 1, squeeze=False)
  values = [np.asarray(maps[layer], np.float64) for layer in layers]
  norm = shared_norm(values, decades=MAP_DECADES)
  row, col = query
  for r, layer in enumerate(layers):
    ax = axes[r, 0]
    ax.imshow(np.clip(image.squeeze(), 0, 1), cmap="gray" if image.shape[-1] == 1 else None)
    ax.add_patch(
      patches.Rectangle(
        (col * patch_size - 0.5, row * patch_size - 0.5),
        patch_size,
        patch_size,
        fill=False,
        edgecolor="red",
        lw=2,
      )
    )
    ax.set_title(f"layer {layer}")
    attn = np.asarray(maps[layer], np.float64)
    gate = gates.get(layer)
    for h in range(heads):
      ax = axes[r, h + 1]
      if h >= attn.shape[0]:
        ax.set_visible(False)
        continue
      ax.imshow(attn[h], cmap="viridis", norm=norm)
      ax.add_patch(patches.Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="red"))
      g = None if gate is None else float(gate[h])
      style = {} if g is None else {"backgroundcolor": colormaps["Reds"](0.85 * g)}
      ax.set_title(head_title(h, g), fontsize="small", **style)
  for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
  shared_colour_bar(fig, axes[:, 1:], norm, MAP_COLOURBAR_LABEL, values)
  return fig
