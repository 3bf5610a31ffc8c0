"""grain input pipelines: infinite sharded training iterator and padded, masked eval batches.

Training order. Epoch e of the (possibly subsampled) source of n examples is the permutation
`perm_e = default_rng([0, seed, e]).permutation(n)`, cut into global batches of G = P * L examples
(P processes, local batch L); the last n mod G examples of each permutation are dropped (they
differ from epoch to epoch). Process p reads rows [p * L, (p + 1) * L) of every global batch, so
the global batch assembled by `jax.make_array_from_process_local_data` is the same, row for row,
whatever the number of processes: a multi-host run reproduces the single-host run, including the
per-row dropout masks. The augmentation of source example i in epoch e draws
from `default_rng([1, seed, e, i])`, so it depends only on (seed, epoch, index), not on the batch
size or the number of processes.

Repeated augmentation (`data.repeated_augmentations` = k > 1, DeiT's RASampler). The epoch
sequence is `repeat(perm_e[:ceil(n / k)], k)[:n]`: the first ceil(n / k) examples of the
permutation, each k times in a row, still n examples per epoch; it is cut into global batches as
above, so the multi-host property holds unchanged. Copy c of example i draws its augmentation from
`default_rng([1, seed, e, i, c])`. (RASampler also spreads the k copies over the k ranks of a step;
here they are adjacent rows of the same global batch, which is the same batch as a whole. It trims
the epoch to a multiple of 256 examples; here the remainder n mod G is dropped, as for k = 1.)

Resuming. The position after global step s is batch s of every process's stream, whatever P and
L are (`start_step`), so a run saved by one topology resumes on another and continues the same
global order; the checkpoint holds no per-process iterator state.

Performance. Each grain prefetch thread builds whole uint8 batches (decode + augment); they cross
to the device as uint8 and the jitted train and eval steps normalise them
(`device_augment.normalize`), so per-example host work is the decode and the ops themselves.
Threads share one interpreter lock: `data.num_workers` > 0 builds training batches in that many
worker processes instead (grain's `mp_prefetch`), in the same order, batch for batch. The
returned grain `DatasetIterator` also has grain's `get_state`/`set_state`; `close()` it (or let the
training loop do so) to stop the workers.
"""

from __future__ import annotations

import functools
import math
import signal
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np
from absl import flags

from locvit.data import augment, resample
from locvit.data.config import checked_data_config

Batch = dict[str, np.ndarray]


def examples_per_epoch(source: Any) -> int:
  """Examples in one epoch of `source` (after any class_limit / train_fraction subsampling).

  Repeated augmentation keeps this number: an epoch then has fewer distinct examples.
  """
  return len(source)


def _read_options(cfg: Any) -> grain.ReadOptions:
  return grain.ReadOptions(num_threads=int(cfg.num_threads), prefetch_buffer_size=int(cfg.prefetch))


def _check_process(process_index: int, process_count: int) -> None:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")


def _stack(examples: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
  return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def _stack_boxes(examples: Sequence[dict[str, Any]], side: int) -> dict[str, np.ndarray]:
  """``_stack`` for cut crop boxes of different sizes: each at the top-left of a side^2 canvas."""
  batch = _stack([{k: v for k, v in ex.items() if k != "image"} for ex in examples])
  return {"image": resample.on_canvas([ex["image"] for ex in examples], side), **batch}


def _int32_labels(batch: dict[str, np.ndarray]) -> Batch:
  batch["label"] = batch["label"].astype(np.int32)
  return batch


class _LazyGenerator:
  """``np.random.default_rng(seed)``, built on first use: seeding one costs about 40 us, more than
  gathering a decoded CIFAR image, and a host transform with no random op (the device runs the
  crop and flip) never uses it."""

  __slots__ = ("_generator", "_seed")

  def __init__(self, seed: list[int]) -> None:
    self._seed, self._generator = seed, None

  def __getattr__(self, name: str) -> Any:
    if self._generator is None:
      self._generator = np.random.default_rng(self._seed)
    return getattr(self._generator, name)


class _EpochOrder:
  """Maps a per-process stream position to (epoch, source index, copy); see the module docstring."""

  def __init__(
    self,
    n: int,
    seed: int,
    process_index: int,
    process_count: int,
    local_batch_size: int,
    repeats: int = 1,
  ) -> None:
    self.n, self.seed, self.repeats = n, seed, repeats
    self.p, self.P, self.L = process_index, process_count, local_batch_size
    self.per_process = n // (process_count * local_batch_size) * local_batch_size

  @functools.lru_cache(maxsize=2)  # noqa: B019  (one object per pipeline; epochs are sequential)
  def sequence(self, epoch: int) -> np.ndarray:
    """The epoch's n source indices in global order (each repeated `repeats` times in a row)."""
    perm = np.random.default_rng([0, self.seed, epoch]).permutation(self.n)
    if self.repeats == 1:
      return perm
    return np.repeat(perm[: -(-self.n // self.repeats)], self.repeats)[: self.n]

  def __call__(self, position: int) -> tuple[int, int, int]:
    epoch, k = divmod(int(position), self.per_process)
    batch, row = divmod(k, self.L)
    j = (batch * self.P + self.p) * self.L + row  # Position in the epoch's global sequence.
    return epoch, int(self.sequence(epoch)[j]), j % self.repeats

  def batch_indices(self, batch: int) -> np.ndarray:
    """The source indices of this process's rows of its ``batch``-th batch (stream positions
    ``batch * L ...``, one epoch: ``per_process`` is a multiple of L), as ``__call__`` maps them."""
    epoch, k = divmod(int(batch), self.per_process // self.L)
    start = (k * self.P + self.p) * self.L
    return self.sequence(epoch)[start : start + self.L].astype(np.int32)

  def rng(self, epoch: int, index: int, copy: int) -> np.random.Generator:
    """The augmentation generator of one (copy of an) example (built when an op first draws)."""
    if self.repeats == 1:  # Kept as it was before repeated augmentation existed.
      return _LazyGenerator([1, self.seed, epoch, index])
    return _LazyGenerator([1, self.seed, epoch, index, copy])


def _checked_order(
  data_config: Any,
  n: int,
  seed: int,
  local_batch_size: int,
  process_index: int,
  process_count: int,
) -> _EpochOrder:
  _check_process(process_index, process_count)
  seed = int(seed)
  if seed < 0:
    raise ValueError(f"seed={seed} must be non-negative")
  if local_batch_size < 1 or n < local_batch_size * process_count:
    raise ValueError(
      f"local_batch_size={local_batch_size} must be in [1, {n // process_count}] "
      f"(a global batch of {local_batch_size} x {process_count} processes must fit in the "
      f"{n} examples of one epoch)"
    )
  repeats = int(data_config.repeated_augmentations)
  return _EpochOrder(n, seed, process_index, process_count, local_batch_size, repeats)


def make_index_iterator(
  data_config: Any,
  num_examples: int,
  *,
  seed: int,
  local_batch_size: int,
  process_index: int = 0,
  process_count: int = 1,
  start_step: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
  """``make_train_iterator``'s batches as the source indices of their rows, ``{'index': int32
  (L,)}``, for a training split held on the device (``data.train_split_on='device'``): the same
  examples in the same rows, from the same arguments. The host ops must draw nothing (checked by
  ``validate_data_config``), so an example is the same in every epoch."""
  data_config = checked_data_config(data_config)
  order = _checked_order(
    data_config, num_examples, seed, local_batch_size, process_index, process_count
  )
  batch = int(start_step)
  while True:
    yield {"index": order.batch_indices(batch)}
    batch += 1


def make_train_dataset(
  data_config: Any,
  source: Any,
  *,
  seed: int,
  local_batch_size: int,
  process_index: int = 0,
  process_count: int = 1,
  start_step: int = 0,
) -> grain.IterDataset:
  """The infinite training `grain.IterDataset` behind `make_train_iterator`."""
  data_config = checked_data_config(data_config)
  order = _checked_order(
    data_config, len(source), seed, local_batch_size, process_index, process_count
  )
  transform = augment.build_train_transform(data_config)
  batch_fn, cut = _stack, None
  if augment.split_train_ops(data_config)[1][:1] == ("random_resized_crop",):
    cut = resample.box_cutter(data_config)  # The boxes and taps the train step's resize reads.
    batch_fn = functools.partial(_stack_boxes, side=resample.canvas_size(data_config))

  def load(position: int, _: Any) -> dict[str, Any]:
    epoch, index, copy = order(position)
    ex, rng = source[index], order.rng(epoch, index, copy)
    image = transform(ex["image"], rng)
    return {**({"image": image} if cut is None else cut(image, rng)), "label": ex["label"]}

  ds = grain.MapDataset.range(order.per_process).repeat()  # repeat() = infinite epochs.
  ds = ds.map_with_index(load)
  ds = ds.batch(local_batch_size, drop_remainder=True, batch_fn=batch_fn)
  if start_step:
    ds = ds[int(start_step) :]  # batch k of this process belongs to global step k + 1
  ds = ds.map(_int32_labels).to_iter_dataset(_read_options(data_config))
  workers = int(data_config.num_workers)
  if not workers:
    return ds
  if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; a notebook never parses them
    flags.FLAGS.mark_as_parsed()
  options = grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2)
  return ds.mp_prefetch(options, worker_init_fn=_ignore_interrupts)


def _ignore_interrupts(worker_index: int, worker_count: int) -> None:
  """A worker leaves Ctrl-C to the training process, which stops and closes the pipeline: the
  terminal's SIGINT reaches the whole process group, and each worker would print a traceback."""
  del worker_index, worker_count
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_train_iterator(data_config: Any, source: Any, **kwargs: Any) -> grain.DatasetIterator:
  """Infinite iterator of {'image': uint8 (B,H,W,C), 'label': int32 (B,)}; the train step
  normalises the images (`device_augment.normalize`).

  Takes `make_train_dataset`'s keyword arguments (`seed`, `local_batch_size`, `process_index`,
  `process_count`, `start_step`). Deterministic given `seed`, reshuffled every epoch; process
  `process_index` reads only its disjoint 1/process_count share of each epoch. It starts with
  the batches of global step `start_step + 1` (a resumed run), which depend on the global batch
  size only.
  """
  return iter(make_train_dataset(data_config, source, **kwargs))


def process_eval_range(n: int, process_index: int, process_count: int) -> tuple[int, int]:
  """[start, stop) of the contiguous eval examples read by a process (sizes differ by <= 1)."""
  _check_process(process_index, process_count)
  return process_index * n // process_count, (process_index + 1) * n // process_count


def num_eval_batches(num_examples: int, local_batch_size: int, process_count: int = 1) -> int:
  """Batches every process yields in one eval pass (the same on all processes)."""
  if local_batch_size < 1:
    raise ValueError(f"local_batch_size={local_batch_size} must be >= 1")
  per_process = math.ceil(num_examples / process_count)
  return max(1, math.ceil(per_process / local_batch_size))


class EvalIterable:
  """Re-iterable eval batches {'image', 'label', 'mask'} of fixed shape.

  Every process yields `len(self)` batches; padding entries (and, with on_corrupt='skip',
  substitutes for corrupt files) have mask False and label 0. Over all processes each
  example appears exactly once with mask True.
  """

  def __init__(
    self,
    data_config: Any,
    source: Any,
    *,
    local_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
  ) -> None:
    data_config = checked_data_config(data_config)
    n = len(source)
    if n == 0:
      raise ValueError(f"eval source {source!r} is empty")
    self.start, self.stop = process_eval_range(n, process_index, process_count)
    self.local_batch_size = local_batch_size
    self.num_batches = num_eval_batches(n, local_batch_size, process_count)
    self._cfg, self._source = data_config, source
    self._transform = augment.build_eval_transform(data_config)
    first = self._transform(source[0]["image"])  # Shape/dtype of the padding image.
    self._pad = {
      "image": np.zeros_like(first),
      "label": np.int32(0),
      "mask": np.bool_(False),
    }

  def __len__(self) -> int:
    return self.num_batches

  def _load(self, i: int) -> dict[str, Any]:
    index = self.start + int(i)
    if index >= self.stop:
      return self._pad
    if hasattr(self._source, "get_checked"):
      ex, ok = self._source.get_checked(index)
    else:
      ex, ok = self._source[index], True
    return {
      "image": self._transform(ex["image"]),
      "label": np.int32(ex["label"]) if ok else np.int32(0),
      "mask": np.bool_(ok),
    }

  def dataset(self) -> grain.IterDataset:
    """A fresh grain pipeline over this process's padded range: ``len(self)`` uint8 batches (the
    eval step normalises them)."""
    ds = grain.MapDataset.range(self.num_batches * self.local_batch_size).map(self._load)
    ds = ds.batch(self.local_batch_size, drop_remainder=True, batch_fn=_stack)
    ds = ds.map(_int32_labels)
    return ds.to_iter_dataset(_read_options(self._cfg))

  def __iter__(self) -> Iterator[Batch]:
    return iter(self.dataset())


def make_eval_iterator(
  data_config: Any,
  source: Any,
  *,
  local_batch_size: int,
  process_index: int = 0,
  process_count: int = 1,
) -> EvalIterable:
  """A re-iterable of padded eval batches; see `EvalIterable`."""
  return EvalIterable(
    data_config,
    source,
    local_batch_size=local_batch_size,
    process_index=process_index,
    process_count=process_count,
  )
