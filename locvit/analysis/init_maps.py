"""Attention maps at initialization, averaged over real images (Zheng, Li, Lucey: Figs. 3-5).

For a model and several initializations (impulse, mimetic, random, ...) this computes every
layer's ``(H, N, N)`` attention averaged over a batch of images and writes PNGs:

- ``<init>.png``: one row per chosen layer; per head the full ``N x N`` map and its zoomed
  upper-left ``zoom x zoom`` block (the red boxes of Fig. 3, 48 x 48 in the paper);
- ``comparison.png``: one row per init, columns = chosen layers (head 0, full map and zoom),
  for a side-by-side comparison as in Fig. 3.

    python -m locvit.analysis.init_maps --model=structvit_tiny_patch2_32 \\
      --inits=impulse,mimetic,trunc_normal --image_folder=/tmp/cifar10 --out=/tmp/init_maps

Off-diagonal impulse peaks show up as shifted diagonals (offset ``m * width + n``), mimetic init
strengthens the main diagonal, and random inits show no pattern.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from matplotlib import colors, patches
from matplotlib.figure import Figure

from locvit.analysis.plots import save, shared_colour_bar, shared_norm
from locvit.choices import ArgumentParser
from locvit.configs.defaults import INIT_NAMES
from locvit.data import augment
from locvit.init.apply import apply_init, init_config
from locvit.models import apply_with_intermediates, block_attention_maps, create_model

PROG = "python -m locvit.analysis.init_maps"


def intermediates_fn(model: nn.Module):
  """A jitted ``(params, images) -> intermediates`` for ``model`` (reuse it across inits)."""
  return jax.jit(lambda p, x: apply_with_intermediates(model, {"params": p}, x)[1])


def attention_maps(
  model: nn.Module, params: Any, images: np.ndarray, batch_size: int = 32, apply=None
) -> dict[int, np.ndarray]:
  """``{layer: (H, N, N)}`` attention probabilities averaged over ``images`` (NHWC, normalised).

  ``apply``: a function from ``intermediates_fn(model)``, to compile once for several inits.
  """
  apply = apply or intermediates_fn(model)
  sums: dict[int, np.ndarray] = {}
  for start in range(0, len(images), batch_size):
    inter = apply(params, images[start : start + batch_size])
    for layer, value in block_attention_maps(inter).items():
      sums[layer] = sums.get(layer, 0.0) + np.asarray(value, np.float64).sum(0)
  if not sums:
    raise ValueError(f"{type(model).__name__} records no attention maps ('.../attn/attention').")
  return {layer: (s / len(images)).astype(np.float32) for layer, s in sorted(sums.items())}


COLOUR_BAR_LABEL = "attention probability\n(mean over the images; one scale for all panels)"


def _show(ax, matrix: np.ndarray, title: str, norm: colors.Normalize, zoom: int | None = None):
  ax.imshow(matrix, cmap="viridis", norm=norm, interpolation="nearest")
  ax.set_title(title, fontsize=7)
  ax.set_xticks([])
  ax.set_yticks([])
  if zoom is not None:  # the block shown enlarged next to the full map
    ax.add_patch(patches.Rectangle((-0.5, -0.5), zoom, zoom, fill=False, ec="red", lw=1))
    ax.set_xlabel("key token", fontsize=7)
    ax.set_ylabel("query token", fontsize=7)


def _shared_scale(fig: Figure, axes: np.ndarray, maps: Sequence[np.ndarray]) -> colors.Normalize:
  """One linear scale from 0 to the largest probability of ``maps``, drawn as ``fig``'s colour
  bar: a near-uniform random init then looks flat beside an impulse, as it is."""
  norm = shared_norm(maps, vmin=0.0)
  shared_colour_bar(fig, axes, norm, COLOUR_BAR_LABEL, maps, shrink=0.8, fontsize=8)
  return norm


def init_figure(maps: Mapping[int, np.ndarray], layers: Sequence[int], zoom: int, title: str):
  """Rows = layers; per head the full map (red box) and the zoomed upper-left block."""
  heads = next(iter(maps.values())).shape[0]
  fig = Figure(figsize=(2.2 * 2 * heads + 1.2, 2.3 * len(layers)))
  axes = fig.subplots(len(layers), 2 * heads, squeeze=False)
  norm = _shared_scale(fig, axes, [maps[layer] for layer in layers])
  for row, layer in enumerate(layers):
    for h in range(heads):
      m = maps[layer][h]
      _show(axes[row, 2 * h], m, f"layer {layer} head {h}", norm, zoom)
      _show(axes[row, 2 * h + 1], m[:zoom, :zoom], f"upper-left {zoom}x{zoom}", norm)
  fig.suptitle(title)
  return fig


def comparison_figure(
  maps_by_init: Mapping[str, Mapping[int, np.ndarray]], layers: Sequence[int], zoom: int
):
  """Rows = inits, columns = layers (head 0): full map and zoom side by side."""
  names = list(maps_by_init)
  fig = Figure(figsize=(2.2 * 2 * len(layers) + 1.2, 2.3 * len(names)))
  axes = fig.subplots(len(names), 2 * len(layers), squeeze=False)
  norm = _shared_scale(fig, axes, [maps_by_init[n][layer][0] for n in names for layer in layers])
  for row, name in enumerate(names):
    for col, layer in enumerate(layers):
      m = maps_by_init[name][layer][0]
      _show(axes[row, 2 * col], m, f"{name}: layer {layer}, head 0", norm, zoom)
      _show(axes[row, 2 * col + 1], m[:zoom, :zoom], f"zoom {zoom}x{zoom}", norm)
  return fig


def write_init_maps(
  maps_by_init: Mapping[str, Mapping[int, np.ndarray]],
  out_dir: str,
  layers: Sequence[int] | None = None,
  zoom: int = 48,
) -> list[str]:
  """Writes ``<init>.png`` per init and ``comparison.png``; returns the paths."""
  first = next(iter(maps_by_init.values()))
  layers = list(layers) if layers is not None else sorted(first)
  missing = sorted(set(layers) - set(first))
  if missing:
    raise ValueError(f"Layers {missing} not in the model's layers {sorted(first)}.")
  zoom = min(zoom, next(iter(first.values())).shape[-1])
  paths = []
  for name, maps in maps_by_init.items():
    fig = init_figure(maps, layers, zoom, f"{name}: attention at init")
    paths.append(save(fig, os.path.join(out_dir, f"{name}.png")))
  paths.append(save(comparison_figure(maps_by_init, layers, zoom), f"{out_dir}/comparison.png"))
  return paths


def compare_inits(
  model_name: str,
  inits: Mapping[str, Mapping[str, Any]],
  images: np.ndarray,
  out_dir: str,
  *,
  layers: Sequence[int] | None = None,
  zoom: int = 48,
  num_classes: int = 10,
  seed: int = 0,
  **model_overrides: Any,
) -> list[str]:
  """Initialises ``model_name`` with each ``inits[name]`` config and writes the PNGs."""
  model = create_model(model_name, num_classes=num_classes, **model_overrides)
  variables = jax.jit(model.init)(jax.random.key(seed), images[:1])
  params = nn.meta.unbox(variables["params"])
  image_size = images.shape[1:3]
  maps, apply = {}, intermediates_fn(model)
  for name, cfg in inits.items():
    initialised = apply_init(cfg, params, model, image_size, seed=seed)
    maps[name] = attention_maps(model, initialised, images, apply=apply)
  return write_init_maps(maps, out_dir, layers, zoom)


def load_images(
  source: Any,
  count: int,
  mean,
  std,
  transform: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
  """``count`` evenly spaced images of a ``locvit.data`` source (so every class appears in
  class-sorted sources), each through ``transform`` (e.g. ``augment.build_eval_transform``: the
  images as the model sees them at evaluation), normalised, as float32 NHWC."""
  index = np.unique(np.linspace(0, len(source) - 1, min(count, len(source))).astype(int))
  transform = transform or (lambda image: image)
  raw = np.stack([transform(source[int(i)]["image"]) for i in index])
  return augment.normalize_batch(raw, tuple(mean), tuple(std)).astype(np.float32)


def main(argv: Sequence[str] | None = None) -> int:
  """Command-line entry point (see the module docstring); prints the path of every PNG written.
  A wrong name or layer, or a missing folder, is one ``error:`` line and exit status 2."""
  from locvit.configs.defaults import CIFAR10_MEAN, CIFAR10_STD
  from locvit.data import ImageFolderSource

  parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="structvit_tiny_patch2_32", help="a registered model")
  parser.add_argument(
    "--inits", default="impulse,mimetic,trunc_normal", help=f"comma-separated, of {INIT_NAMES}"
  )
  parser.add_argument("--image_folder", required=True, help="ROOT/<split>/<class>/*.jpg")
  parser.add_argument("--split", default="train")
  parser.add_argument(
    "--image_size",
    type=int,
    default=32,
    help="the model's input side: each image is resized and centre-cropped to it, as evaluation "
    "does (the default model's is 32)",
  )
  parser.add_argument("--num_images", type=int, default=256, help="images averaged over")
  parser.add_argument("--layers", default="0,5,11", help="comma-separated layer indices")
  parser.add_argument("--zoom", type=int, default=48, help="side of the zoomed upper-left block")
  parser.add_argument("--filter_size", type=int, default=3, help="impulse: the kernel's side")
  parser.add_argument("--mode", default="same", help="impulse: 'same' or 'different'")
  parser.add_argument("--out", required=True, help="directory of the PNGs")
  args = parser.parse_args(argv)
  try:
    inits = {}
    for name in args.inits.split(","):
      extra = dict(filter_size=args.filter_size, mode=args.mode) if name == "impulse" else {}
      inits[name] = init_config(name, **extra)
    source = ImageFolderSource(args.image_folder, args.split)
    as_evaluated = lambda image: augment.resize_center_crop(image, args.image_size)
    images = load_images(source, args.num_images, CIFAR10_MEAN, CIFAR10_STD, as_evaluated)
    layers = [int(x) for x in args.layers.split(",")]
    paths = compare_inits(args.model, inits, images, args.out, layers=layers, zoom=args.zoom)
  except (ValueError, FileNotFoundError) as e:  # a wrong name or layer, a missing folder
    print(f"locvit.analysis.init_maps: error: {e}", file=sys.stderr)
    return 2
  for path in paths:
    print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
