"""The analyze command: a run's training curves and its attention figures, from its workdir.

  python -m locvit.main --workdir=DIR --mode=analyze

Reads ``DIR/metrics.jsonl`` (the ``locality/...`` records the trainer logs at each evaluation
when ``config.analysis.locality`` is True), ``DIR/eval.jsonl`` (the results of ``--mode=eval``)
and the latest checkpoint in ``DIR/checkpoints``, and writes into ``DIR/analysis`` (or
``output_dir``):

- ``training_curves.png``: train and eval loss, eval top-1 and top-5 in % (and the EMA's, when
  logged) over training, for any model, with the ``--mode=eval`` results as crosses;
- ``nonlocality.png``: head-averaged nonlocality of every layer over training (ConViT Fig. 5);
- ``gates.png``: ``sigmoid(lambda_h)`` of every head of every GPSA layer over training (Fig. 6);
- ``attention_maps.png``: the attention of one query patch for every head of chosen layers on one
  eval image, on one colour scale, each GPSA head's gate in its title (Fig. 7), from the
  checkpoint's parameters and the real per-layer inputs;
- ``attention_centers.png``: the Gaussian heads' centres and spreads (Cordonnier et al. Fig. 3),
  for Cordonnier's quadratic layers and ConViT's GPSA layers;
- ``masks_layer<i>.png``: the GMM / ELM masks of the chosen layers (Li & Zhang Figs. 3-4).

The attention figures are drawn for ViT-family models (ViT, DeiT, ConViT, GMM / ELM-ViT,
structured-init ViTs) and Cordonnier et al.'s networks; other models (ResNet, Swin, CaiT, PiT,
T2T, ConvMixer) get the training curves and one warning. The locality curves need logged
records; without them the other figures are drawn (and, for a ViT, a warning says how to log
them). A series of one point is drawn as a marker. Before the first evaluation, one warning says
so, and so do the figures: the accuracy panel, and the locality curves, which hold only the
initialisation. Run it as a single process.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging

from locvit import data as data_lib
from locvit import metrics as metrics_lib
from locvit.analysis import centers, locality, masks, plots
from locvit.attention import TokenGrid
from locvit.configs import defaults
from locvit.configs.common import complete_config
from locvit.models.cordonnier import CordonnierNet
from locvit.models.factory import build_model
from locvit.models.vit import VisionTransformer
from locvit.workdir import fingerprint, paths, restore

# The paper's Fig. 7 shows layers 2 and 10 (1-based), i.e. blocks 1 and 9.
PAPER_MAP_LAYERS = (1, 9)
_HEAD_KEY = re.compile(rf"^{locality.PREFIX}/(\w+)/layer_(\d+)/head_(\d+)$")


def _analysis_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  analysis = defaults.analysis_config()
  analysis.update(config.analysis or {})
  return analysis


# ------------------------------------------------------------------------------------------------
# Curves from metrics.jsonl


def locality_series(records: Sequence[dict[str, Any]]) -> tuple[np.ndarray, dict]:
  """``(steps (T,), {name: {layer: (T, H)}})`` from the records holding per-head locality keys.

  A head missing from a record is NaN at that point.
  """
  rows = [r for r in records if any(_HEAD_KEY.match(k) for k in r)]
  steps = np.asarray([r["step"] for r in rows], np.int64)
  shapes: dict[str, dict[int, int]] = {}
  for r in rows:
    for key in r:
      if m := _HEAD_KEY.match(key):
        name, layer, head = m.group(1), int(m.group(2)), int(m.group(3))
        heads = shapes.setdefault(name, {})
        heads[layer] = max(heads.get(layer, 0), head + 1)
  series = {
    name: {layer: np.full((len(rows), h), np.nan) for layer, h in layers.items()}
    for name, layers in shapes.items()
  }
  for t, r in enumerate(rows):
    for key, value in r.items():
      if m := _HEAD_KEY.match(key):
        series[m.group(1)][int(m.group(2))][t, int(m.group(3))] = value
  return steps, series


def epochs_per_step(records: Sequence[dict[str, Any]]) -> float | None:
  """The trainer logs ``epoch = step / steps_per_epoch``; recover the ratio if any record has it."""
  for r in records:
    if r.get("epoch") and r.get("step"):
      return float(r["epoch"]) / float(r["step"])
  return None


# ------------------------------------------------------------------------------------------------
# Parameters and images


def restore_params(
  config: ml_collections.ConfigDict,
  workdir: str,
  model: nn.Module,
  image_shape: tuple[int, ...],
  step: int | None = None,
) -> tuple[Any, int]:
  """``(params, step)`` of a checkpoint in ``workdir/checkpoints`` (latest by default), restored
  onto one device without the optimizer state."""
  params, _, step = restore.restore_model_variables(
    workdir,
    model,
    image_shape,
    step=step,
    check=lambda meta: fingerprint.check_compatible(meta["config"], config, workdir),
  )
  return params, step


def display_image(config: ml_collections.ConfigDict, image: np.ndarray) -> np.ndarray:
  """Undoes the eval normalisation (``x * std + mean``) for display in [0, 1]."""
  mean, std = np.asarray(config.data.mean, np.float32), np.asarray(config.data.std, np.float32)
  if image.shape[-1] == 1:  # the pipeline averages 3-channel statistics for 1-channel images
    mean, std = mean.mean(keepdims=True), std.mean(keepdims=True)
  return np.clip(image * std + mean, 0.0, 1.0)


def _check_layers(layers: Sequence[int], depth: int, name: str = "layers") -> tuple[int, ...]:
  """``name``: the field the layers came from (``analysis.map_layers`` on the command line)."""
  layers = tuple(sorted({int(i) for i in layers}))
  bad = [i for i in layers if not 0 <= i < depth]
  if bad or not layers:
    raise ValueError(f"{name}={list(layers)}: choose layer indices in [0, {depth - 1}].")
  return layers


def _check_query(query: Sequence[int], grid, name: str = "query") -> tuple[int, int]:
  if len(query) != 2 or not (0 <= query[0] < grid.height and 0 <= query[1] < grid.width):
    raise ValueError(
      f"{name}={tuple(query)} must be a (row, col) patch of the {grid.height}x{grid.width} grid: "
      f"rows in [0, {grid.height - 1}], columns in [0, {grid.width - 1}]."
    )
  return int(query[0]), int(query[1])


def query_maps(
  model: nn.Module, params: Any, image: np.ndarray, layers: Sequence[int], query: tuple[int, int]
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray | None]]:
  """``({layer: (H, gh, gw)}, {layer: gates or None})``: the query patch's attention over patches.

  Class-token rows/columns are dropped and the row renormalised over patches (as for Eq. 8).
  """
  grid = locality.token_grid(model, image[None])
  attention = jax.jit(functools.partial(locality.per_layer_attention, model))
  maps = jax.device_get(attention(params, image[None]))
  q = query[0] * grid.width + query[1]
  out, gates = {}, {}
  for i in layers:
    if i not in maps:
      raise ValueError(f"Layer {i} ({locality.layer_kinds(model)[i]}) records no attention map.")
    p = locality.prefix_tokens(model, i)
    row = np.asarray(maps[i][0, :, p + q, p:], np.float64)
    out[i] = (row / row.sum(-1, keepdims=True)).reshape(-1, grid.height, grid.width)
    stats = locality.parameter_statistics(jax.device_get(params[f"blocks_{i}"]["attn"]))
    gates[i] = np.asarray(stats["gate"]) if "gate" in stats else None
  return out, gates


TRAINING_CURVES = tuple(
  f"{split}/{name}"
  for split in ("train", "eval", "eval_ema")
  for name in ("loss", "top1", "top5")
  if split != "train" or name == "loss"
)


def _series(records: Sequence[dict[str, Any]], suffix: str = "") -> dict:
  series = {}
  for key in TRAINING_CURVES:
    rows = sorted((r["step"], r[key]) for r in records if key in r)
    if rows:
      steps, values = zip(*rows, strict=True)
      series[key + suffix] = (np.asarray(steps), np.asarray(values, dtype=float))
  return series


def training_series(
  records: Sequence[dict[str, Any]], evaluations: Sequence[dict[str, Any]] = ()
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """``{key: (steps, values)}`` of each ``TRAINING_CURVES`` key logged in ``records``, and of the
  ``--mode=eval`` results ``evaluations`` (``eval.jsonl``) per evaluated split, as
  ``'eval/top1 (--mode=eval on test)'``."""
  series = _series(records)
  for split in dict.fromkeys(r.get("eval_split") for r in evaluations):
    rows = [r for r in evaluations if r.get("eval_split") == split]
    series.update(_series(rows, f" ({plots.MODE_EVAL} on {split})"))
  return series


def _records(workdir: str) -> list[dict[str, Any]]:
  """The rows of ``workdir/metrics.jsonl``; [] before the run logged any."""
  exists = (paths.path(workdir) / metrics_lib.METRICS).exists()
  return metrics_lib.read_metrics(workdir) if exists else []


def evaluated(workdir: str) -> bool:
  """Whether ``workdir`` holds an evaluation: by the trainer, or by ``--mode=eval``."""
  rows = [*_records(workdir), *metrics_lib.read_evaluations(workdir)]
  return any("eval/top1" in r for r in rows)


def training_curves(workdir: str, output_dir: str, *, title: str = "") -> list[str]:
  """``training_curves.png`` from ``workdir/metrics.jsonl`` and ``eval.jsonl``; ``[]`` without
  logged metrics."""
  series = training_series(_records(workdir), metrics_lib.read_evaluations(workdir))
  if not series:
    return []
  fig = plots.training_curves_figure(series, title=title)
  return [plots.save(fig, paths.path(output_dir) / "training_curves.png")]


def curve_figures(
  workdir: str, output_dir: str, *, title: str = "", hint: bool = True
) -> list[str]:
  """Figs. 5 and 6 from ``workdir/metrics.jsonl``; ``[]`` without records (and, with ``hint``
  (a model the trainer logs locality for), a warning saying how to log them)."""
  records = _records(workdir)
  steps, series = locality_series(records)
  if "nonlocality" not in series:
    if hint:
      logging.warning(
        "No locality records in %s: set config.analysis.locality=True when training to get the "
        "nonlocality curve (and, for GPSA layers, the gates). Drawing the other figures.",
        paths.path(workdir) / metrics_lib.METRICS,
      )
    return []
  # The trainer logs locality at step 0 and at each of its evaluations.
  note = None if steps.any() else f"the initialisation only: {plots.NO_EVALUATION} in training"
  ratio = epochs_per_step(records)
  x, xlabel = (steps * ratio, "epoch") if ratio else (steps, "step")
  layer_means = {i: np.nanmean(v, axis=1) for i, v in series["nonlocality"].items()}
  fig = plots.nonlocality_figure(x, layer_means, xlabel=xlabel, title=title, note=note)
  written = [plots.save(fig, paths.path(output_dir) / "nonlocality.png")]
  if "gate" in series:
    fig = plots.gate_figure(x, series["gate"], xlabel=xlabel, title=title, note=note)
    written.append(plots.save(fig, paths.path(output_dir) / "gates.png"))
  return written


# ------------------------------------------------------------------------------------------------
# The command


def analyze(
  config: ml_collections.ConfigDict,
  workdir: str,
  output_dir: str | None = None,
  *,
  layers: Sequence[int] | None = None,
  query: tuple[int, int] | None = None,
  step: int | None = None,
) -> list[str]:
  """Writes the ConViT figures for ``workdir`` and returns the PNG paths.

  Args:
    config: the run's config (model, data and ``config.analysis``).
    workdir: the training workdir (``metrics.jsonl``, ``checkpoints/``).
    output_dir: where to write; default ``workdir/analysis``.
    layers: layers of the attention-map figure (0-based); default ``config.analysis.map_layers``
      or the paper's layers 2 and 10 (indices 1, 9) clipped to the depth.
    query: ``(row, col)`` query patch; default ``config.analysis.query`` or the centre patch.
    step: checkpoint step for the maps; default the latest.
  """
  run = _check_run(workdir)
  config = complete_config(config)  # fields the config lacks (an older config.json) as defaults
  analysis = _analysis_config(config)
  output_dir = output_dir or run / "analysis"
  label = model_label(config)
  curves = training_curves(workdir, output_dir, title=label)  # any model
  if not evaluated(workdir):
    logging.warning(
      "No evaluation in %s yet: the figures show no accuracy, nor locality after initialisation. "
      "`--mode=eval --workdir=%s` evaluates the latest checkpoint.",
      workdir,
      workdir,
    )

  # Everything that can be wrong with the arguments is checked before any compilation.
  source = data_lib.make_source(config.data, config.data.eval_split)
  model = build_model(config, config.data.num_classes or source.num_classes)
  if not isinstance(model, VisionTransformer | CordonnierNet):  # a ResNet, Swin, CaiT, ...
    logging.warning(
      "%s (%s): the attention figures are drawn for ViT-family models (ViT, DeiT, ConViT, GMM / "
      "ELM-ViT, structured-init ViTs) and Cordonnier et al.'s networks; drawing the training "
      "curves only.",
      config.model.name,
      type(model).__name__,
    )
    return curves
  images = locality.fixed_eval_images(config, analysis.map_image_index + 1, source=source)
  if analysis.map_image_index >= len(images):
    raise ValueError(
      f"analysis.map_image_index={analysis.map_image_index}: the eval split "
      f"({config.data.eval_split!r}) has {len(images)} images, indices 0-{len(images) - 1}."
    )
  image = images[analysis.map_image_index]
  grid, patch_size = image_grid(model, image.shape)
  layers, query = _layers_and_query(analysis, model.depth, grid, layers, query)

  vit = isinstance(model, VisionTransformer)  # locality is logged for these (locality.py)
  written = curves + curve_figures(workdir, output_dir, title=label, hint=vit)
  params, step = restore_params(config, workdir, model, image.shape, step)
  if vit:
    maps, gates = query_maps(model, params, image, layers, query)
  else:
    maps, gates = grid_query_maps(model, params, image, layers, query), {}
  fig = plots.attention_maps_figure(
    display_image(config, image), grid, query, maps, gates, patch_size=patch_size
  )
  fig.suptitle(f"{label}, step {step}, query patch {query}")
  written.append(plots.save(fig, paths.path(output_dir) / "attention_maps.png"))
  return written + mechanism_figures(model, params, image, layers, output_dir, config, step)


def _check_run(workdir: str):
  """``workdir`` as a path, or FileNotFoundError when it holds no training run."""
  run = paths.path(workdir)
  if not (run / metrics_lib.METRICS).exists() and not (run / "checkpoints").exists():
    raise FileNotFoundError(  # was a warning about locality records first, then this
      f"{workdir} holds no run: no {metrics_lib.METRICS}, no checkpoints/ (--mode=analyze draws "
      "the figures of a training run's --workdir)"
    )
  return run


def _layers_and_query(analysis, depth: int, grid, layers, query) -> tuple[list[int], tuple]:
  """The map layers and query patch, checked: the arguments, else ``config.analysis``'s, else the
  paper's layers (clipped to ``depth``) and the centre patch."""
  default_layers = analysis.map_layers or [min(i, depth - 1) for i in PAPER_MAP_LAYERS]
  if layers is None:
    layers = _check_layers(default_layers, depth, "analysis.map_layers")
  else:
    layers = _check_layers(layers, depth)
  if query is None and analysis.query:
    query = _check_query(analysis.query, grid, "analysis.query")
  else:
    query = _check_query(query or (grid.height // 2, grid.width // 2), grid)
  return layers, query


# Overrides that change what a figure shows (its token grid, its layers and heads): the titles
# name them beside the registered name, whose own sizes they replace.
SHAPE_FIELDS = ("patch_size", "downsample", "depth", "num_heads", "embed_dim", "hidden_dim")


def model_label(config: ml_collections.ConfigDict) -> str:
  """The figures' name of the run's model: ``structvit_d8_dim64_h4_patch2_32 (patch_size=4)``."""
  overrides = config.model.overrides or {}
  shape = ", ".join(f"{k}={overrides[k]}" for k in SHAPE_FIELDS if k in overrides)
  return f"{config.model.name} ({shape})" if shape else config.model.name


def image_grid(model: nn.Module, image_shape: tuple[int, ...]) -> tuple[TokenGrid, int]:
  """``(token grid, pixels per token side)`` of a ViT-family or Cordonnier model."""
  block = model.patch_size if isinstance(model, VisionTransformer) else model.downsample
  return TokenGrid(image_shape[0] // block, image_shape[1] // block), block


def grid_query_maps(
  model: nn.Module, params: Any, image: np.ndarray, layers: Sequence[int], query: tuple[int, int]
) -> dict[int, np.ndarray]:
  """``{layer: (H, gh, gw)}``: the query token's attention in a model without prefix tokens
  (Cordonnier et al.'s), from its recorded attention maps (a pruned layer's own head count)."""
  maps, _, _ = centers.attention_maps(model, {"params": params}, image[None], query)
  return {i: maps[i][~np.isnan(maps[i]).all(axis=(1, 2))] for i in layers}


def mechanism_figures(model, params, image, layers, output_dir, config, step) -> list[str]:
  """The figures of the model's own positional mechanism, where it has one: the Gaussian heads'
  attention centres (Cordonnier's quadratic layers, ConViT's GPSA; Cordonnier et al. Fig. 3)
  and the GMM / ELM masks of the map layers (Li & Zhang Figs. 3-4)."""
  written, title = [], f"{model_label(config)}, step {step}"
  if centers.gaussian_heads(params):
    fig = centers.attention_centers_figure(params, title=title)
    written.append(plots.save(fig, paths.path(output_dir) / "attention_centers.png", dpi=100))
  grid = image_grid(model, image.shape)[0]
  for path, table in masks.collect_mask_tables(model, {"params": params}, image[None]).items():
    layer = re.search(r"blocks_(\d+)/", path)
    if layer and int(layer.group(1)) in layers:
      fig = masks.mask_table_figure(table, grid, title=f"{title}: {path}")
      out = paths.path(output_dir) / f"masks_layer{layer.group(1)}.png"
      written.append(plots.save(fig, out, dpi=100))
  return written
