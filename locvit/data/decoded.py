"""Decode once: small datasets kept in memory as one uint8 array after their first read.

CIFAR, SVHN, digits-sized and Tiny-ImageNet-sized datasets are cheap to hold decoded (CIFAR-10's
training set is 154 MB) and expensive to decode every epoch (a JPEG decode costs more than the
whole CIFAR augmentation). ``cache_decoded`` wraps a source whose decoded size fits
``data.decoded_cache_mb``; an ImageNet-size dataset keeps streaming, with one log line naming its
size and the field.

The cache fills lazily, on each example's first read, so a run starts at once and each process
holds only what it reads: its own contiguous share of an eval split, and for training the examples
its batches have touched (the training order is a global permutation, so after a few epochs that
is the whole split). The images are the source's decoded images, before any augmentation, so
every transform and its randomness stay as they were.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

_NOT_READ, _DECODED, _SUBSTITUTED = 0, 1, 2


class DecodedCache:
  """A source that keeps each decoded example in one preallocated ``(n, H, W, C)`` uint8 array.

  Thread-safe for grain's reader threads: each index is written by whoever decodes it first (a
  race writes the same bytes twice). An image whose shape differs from the first one is returned
  uncached. Attributes the wrapper lacks (``num_skipped``, ...) are the source's.
  """

  def __init__(self, source: Any, image_shape: tuple[int, ...]) -> None:
    self.source = source
    n = len(source)
    self.images = np.empty((n, *image_shape), np.uint8)  # Pages are committed as rows fill.
    self._label = np.zeros(n, np.int32)
    self._state = np.zeros(n, np.int8)
    self.labels = source.labels
    self.num_classes = source.num_classes
    self.class_names = source.class_names

  def __len__(self) -> int:
    return len(self._state)

  def __getstate__(self) -> dict:
    """A worker process (data.num_workers) starts with an empty cache of its own: sending the
    filled one would copy the whole array to every worker."""
    state = dict(self.__dict__)
    state["images"] = self.images.shape
    del state["_label"], state["_state"]
    return state

  def __setstate__(self, state: dict) -> None:
    shape = state.pop("images")
    self.__dict__.update(state)
    self.images = np.empty(shape, np.uint8)
    self._label = np.zeros(shape[0], np.int32)
    self._state = np.zeros(shape[0], np.int8)

  def __repr__(self) -> str:
    return f"DecodedCache({self.source!r})"

  def __getattr__(self, name: str) -> Any:
    if name == "source":  # Not yet set (copy/unpickling): no recursion.
      raise AttributeError(name)
    return getattr(self.source, name)

  @property
  def num_cached(self) -> int:
    """Examples decoded so far and held in memory."""
    return int(np.count_nonzero(self._state))

  def get_checked(self, index: int) -> tuple[dict[str, np.ndarray], bool]:
    """(example, ok) as the source returns them; ok is False for a corrupt file's substitute."""
    n, i = len(self), int(index)
    if not -n <= i < n:
      raise IndexError(f"index {i} out of range for {n} examples")
    i %= n
    state = self._state[i]
    if state != _NOT_READ:
      return {"image": self.images[i], "label": self._label[i]}, state == _DECODED
    if hasattr(self.source, "get_checked"):
      example, ok = self.source.get_checked(i)
    else:
      example, ok = self.source[i], True
    if example["image"].shape == self.images.shape[1:]:
      self.images[i] = example["image"]
      self._label[i] = example["label"]
      self._state[i] = _DECODED if ok else _SUBSTITUTED
    return example, ok

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return self.get_checked(index)[0]


def decoded_megabytes(num_examples: int, image_shape: tuple[int, ...]) -> float:
  """Size in MB (10^6 bytes) of ``num_examples`` uint8 images of ``image_shape``."""
  return num_examples * math.prod(image_shape) / 1e6


def cache_decoded(source: Any, budget_mb: float, split: str) -> Any:
  """``source`` wrapped in a ``DecodedCache`` when its decoded size fits ``budget_mb``.

  The size is the first image's shape times the number of examples (the datasets this is for have
  one image size). Sources already held as arrays (``images`` attribute) and a budget of 0 are
  returned unchanged.
  """
  if budget_mb <= 0 or hasattr(source, "images") or len(source) == 0:
    return source
  shape = tuple(source[0]["image"].shape)
  size_mb = decoded_megabytes(len(source), shape)
  if size_mb > budget_mb:
    logger.info(
      "The %s split streams from %r: decoded once it would take %s MB, over "
      "data.decoded_cache_mb=%g (raise it to decode once and keep the images in memory).",
      split,
      source,
      f"{size_mb:,.1f}",
      budget_mb,
    )
    return source
  return DecodedCache(source, shape)
