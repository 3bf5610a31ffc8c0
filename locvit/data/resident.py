"""The decoded training split in accelerator memory (``data.train_split_on='device'``).

A small split (CIFAR-10's 50,000 training images are 154 MB as uint8) is decoded once at
start-up, with every core decoding, and placed on every device. Each step then receives only the
source indices of its rows (``pipeline.make_index_iterator``: the host pipeline's order, row for
row) and gathers its batch inside the jitted step (``gather``). No per-step host work, image
transfer or interpreter lock then paces a step that the accelerator runs in a few milliseconds,
and no epoch is spent decoding. The host ops of the recipe must draw nothing (a resize to
``image_size``), so they are applied once, here; the crop, flip and auto_augment run in the step
(``data.augment_on='device'``).
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import jax
import numpy as np

from locvit.data import augment, decoded
from locvit.data.config import checked_data_config

_CHUNK = 256  # examples per decoding task


def load_train_split(data_config: Any, source: Any) -> dict[str, np.ndarray]:
  """``{'image': uint8 (n, H, W, C), 'label': int32 (n,)}``: every example of ``source`` through
  the host ops of the train transform, as the host pipeline reads it (the same substitute for a
  corrupt file under ``data.on_corrupt='skip'``), decoded on ``os.cpu_count()`` threads.

  Raises ValueError, before decoding more than one image, when the split would not fit
  ``data.decoded_cache_mb``; and when an image comes out at another shape than the first.
  """
  cfg = checked_data_config(data_config)
  transform = augment.build_train_transform(cfg)
  # Through a decode-once cache's own source: it would keep a second copy of every image.
  reader = source.source if isinstance(source, decoded.DecodedCache) else source
  n = len(reader)
  first = transform(reader[0]["image"], None)  # host ops here draw nothing: no generator
  size_mb = decoded.decoded_megabytes(n, first.shape)
  if size_mb > cfg.decoded_cache_mb:
    raise ValueError(
      f"data.train_split_on='device' keeps the decoded training split on every device: "
      f"{size_mb:,.1f} MB for {n} images of {'x'.join(map(str, first.shape))}, over "
      f"data.decoded_cache_mb={cfg.decoded_cache_mb:g}; raise it, or set "
      "data.train_split_on='host'"
    )
  images, labels = np.empty((n, *first.shape), np.uint8), np.empty(n, np.int32)

  def read(start: int) -> None:
    for i in range(start, min(start + _CHUNK, n)):
      example = reader[i]
      image = transform(example["image"], None)
      if image.shape != first.shape:
        raise ValueError(
          f"data.train_split_on='device' needs every training image at one shape: example {i} "
          f"of {reader!r} is {image.shape} after the host ops, example 0 {first.shape}"
        )
      images[i], labels[i] = image, example["label"]

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    list(pool.map(read, range(0, n, _CHUNK)))  # re-raises a task's error
  return {"image": images, "label": labels}


def on_device(split: dict[str, np.ndarray], sharding: jax.sharding.Sharding) -> dict[str, Any]:
  """``split`` as global arrays laid out by ``sharding`` (replicated: a step's rows may be any
  example); every process passes the same split."""
  return {
    name: jax.make_array_from_callback(array.shape, sharding, lambda index, a=array: a[index])
    for name, array in split.items()
  }


def gather(train_split: Any, batch: dict[str, Any]) -> dict[str, Any]:
  """The batch whose rows ``batch['index']`` names, from the split on the device; a batch of
  images (the host pipeline's) is returned as it is."""
  if "index" not in batch:
    return batch
  index = batch["index"]
  return {"image": train_split["image"][index], "label": train_split["label"][index]}
