"""Evaluating and predicting with published weights (``config.init_from.weights``), no training run.

The weights bring their model, class count and preprocessing (``locvit.convert.load_pretrained``;
timm's ``resolve_model_data_config``): ``with_weights`` puts them into the config, so that
``--mode=eval`` reads the evaluation split exactly as timm's ``create_transform(is_training=False)``
does (``locvit.data.augment.resize_center_crop``) and ``predict`` writes one JSON line per image:

  {"file": "cat/1.jpg", "top5": [281, 285, ...], "top5_prob": [0.71, ...],
   "top5_class": ["tabby, tabby cat", ...]}
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from locvit.convert.pretrained import Pretrained, load_pretrained, resolve_weights
from locvit.data import augment
from locvit.data.sources import IMAGE_EXTENSIONS, CorruptImageError, decode_image
from locvit.run import checks
from locvit.workdir import paths

PREDICTIONS = "predictions.jsonl"
PROGRESS_SECONDS = 10.0  # a progress line at most this often on a long folder


def load_weights(config: ml_collections.ConfigDict, *, seed: int = 0) -> Pretrained:
  """``config.init_from.weights`` as they were published: the architecture they name (a hub
  ``config.json``, a converter's metadata), else ``config.model.name`` with its overrides; their
  own class count and image size."""
  weights = resolve_weights(config.init_from.weights)
  if weights.architecture:
    return load_pretrained(weights, seed=seed)
  return load_pretrained(
    weights, model=config.model.name, seed=seed, **dict(config.model.overrides or {})
  )


def with_weights(config: ml_collections.ConfigDict, pretrained: Pretrained):
  """A copy of ``config`` running ``pretrained``'s model on its class count, reading images with
  its preprocessing (image size, resize and crop fraction, interpolation, mean and std)."""
  data = pretrained.data_config
  if data.crop_mode != "center":
    raise ValueError(
      f"{pretrained.source}: crop_mode={data.crop_mode!r}; locvit evaluates with timm's 'center' "
      "crop only"
    )
  if data.input_size[0] != 3:  # image folders decode to RGB (timm's loader: convert('RGB'))
    raise ValueError(
      f"{pretrained.source}: weights for {data.input_size[0]}-channel images; --mode=eval and "
      "--mode=predict read image folders as RGB, so give weights trained on RGB images"
    )
  config = copy.deepcopy(config)
  with config.unlocked():
    config.model.name = pretrained.model
    config.model.overrides = ml_collections.ConfigDict(dict(pretrained.overrides))
    config.data.num_classes = pretrained.num_classes
    config.data.image_size = data.image_size
    config.data.eval_crop_pct = data.crop_pct
    config.data.interpolation = data.interpolation
    config.data.mean, config.data.std = tuple(data.mean), tuple(data.std)
  return config


def image_files(root: str, split: str) -> tuple[list[str], list[str] | None]:
  """The images to predict and the folder's class names: ``ROOT/SPLIT/<class>/*`` when that split
  has class folders (the evaluation split, as ``--mode=eval`` reads it), else every image under
  ``ROOT`` (a folder of loose images; no class names). Sorted."""
  split_dir = os.path.join(root, split)
  if os.path.isdir(split_dir):
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    if classes:
      files = [
        os.path.join(split_dir, name, f)
        for name in classes
        for f in sorted(os.listdir(os.path.join(split_dir, name)))
        if f.lower().endswith(IMAGE_EXTENSIONS)
      ]
      return files, classes
  if not os.path.isdir(root):
    raise FileNotFoundError(f"{root}: no such folder; give --data=image_folder:DIR")
  files = sorted(
    os.path.join(folder, f)
    for folder, _, names in os.walk(root)
    for f in names
    if f.lower().endswith(IMAGE_EXTENSIONS)
  )
  if not files:
    raise FileNotFoundError(
      f"{root}: no .jpg/.jpeg/.png images, neither in {split}/<class>/ nor in the folder itself"
    )
  return files, None


def class_names(
  pretrained_names: Sequence[str] | None, folder_names: Sequence[str] | None, num_classes: int
) -> list[str] | None:
  """The name of each output: the weights' own (ImageNet's for 1000-class ImageNet weights), else
  the folder's classes when there are as many; else None."""
  if pretrained_names is not None:
    return list(pretrained_names)
  if folder_names is not None and len(folder_names) == num_classes:
    return list(folder_names)
  return None


def predict(
  apply: Callable[[jax.Array], jax.Array],
  data_config: Any,
  files: Sequence[str],
  root: str,
  names: Sequence[str] | None,
  workdir: str,
  *,
  batch_size: int,
  print_line: Callable[[str], None] = print,
  warn: Callable[[str], None] = print,
) -> str:
  """Writes ``WORKDIR/predictions.jsonl``: per readable image, its path relative to ``root``, the
  top-5 class indices, their probabilities (softmax of ``apply``'s logits) and, when ``names`` is
  given, their names. An unreadable image is named with ``warn`` and left out; a progress line
  goes to ``print_line`` every ``PROGRESS_SECONDS``. Returns the file's path."""
  transform = augment.build_eval_transform(data_config)
  scale, offset = augment.normalization_constants(data_config.mean, data_config.std, 3)
  top5 = jax.jit(lambda x: jax.lax.top_k(jax.nn.softmax(apply(x), axis=-1), 5))
  out_dir = paths.path(workdir)
  out_dir.mkdir(parents=True, exist_ok=True)
  target = out_dir / PREDICTIONS
  partial = out_dir / (PREDICTIONS + ".partial")  # complete or absent: renamed at the end
  start = last = time.perf_counter()
  written, skipped = 0, []
  with partial.open("w") as f:
    for first in range(0, len(files), batch_size):
      batch, kept = [], []
      for path in files[first : first + batch_size]:
        try:
          batch.append(transform(decode_image(path)))
          kept.append(path)
        except CorruptImageError as e:
          skipped.append(path)
          warn(f"locvit: skipped an unreadable image: {e}")
      if not batch:
        continue
      images = np.zeros((batch_size, *batch[0].shape), np.float32)
      images[: len(batch)] = np.stack(batch).astype(np.float32) * scale - offset
      probs, indices = jax.device_get(top5(jnp.asarray(images)))
      for path, p, i in zip(kept, probs, indices, strict=False):
        row = {"file": os.path.relpath(path, root), "top5": i.tolist()}
        row["top5_prob"] = [round(float(v), 6) for v in p]
        row["top5_class"] = [names[k] for k in i] if names is not None else [str(k) for k in i]
        f.write(json.dumps(row) + "\n")
        written += 1
      now = time.perf_counter()
      if now - last >= PROGRESS_SECONDS and first + batch_size < len(files):
        last = now
        done = first + batch_size
        print_line(f"predicting: {done}/{len(files)} images ({now - start:.0f} s)")
  partial.rename(target)
  note = f" ({len(skipped)} unreadable image(s) skipped)" if skipped else ""
  print_line(f"Wrote {written} predictions to {target}{note}")
  return str(target)


def predict_weights(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  print_line: Callable[[str], None] = print,
  warn: Callable[[str], None] = print,
) -> str:
  """``--mode=predict``'s work: ``WORKDIR/predictions.jsonl`` of ``config.data.root`` (its
  evaluation split, or its loose images) with ``config.init_from.weights``, run as they were
  published (``load_weights``, ``with_weights``; evaluation mode, so a distilled DeiT combines its
  two heads as ``distilled_inference`` says). Each ``Pretrained.notes`` line goes to
  ``print_line`` first. Returns the file's path. The config is checked as a training run's is
  (``checks.check_config``), with the weights' model in it, before anything is written."""
  files, folder_classes = image_files(config.data.root, config.data.eval_split)
  pretrained = load_weights(config, seed=config.seed)
  for note in pretrained.notes:
    print_line(f"note: {note}")
  weights_config = checks.check_config(with_weights(config, pretrained))
  model = pretrained.create_model()
  names = class_names(pretrained.label_names, folder_classes, pretrained.num_classes)
  variables = pretrained.variables
  return predict(
    lambda images: model.apply(variables, images, train=False),
    weights_config.data,
    files,
    config.data.root,
    names,
    workdir,
    batch_size=min(config.eval_batch_size or config.batch_size, len(files)),
    print_line=print_line,
    warn=warn,
  )
