"""Random-access data sources (grain-compatible) and the `make_source` factory.

A source has `__len__`, `__getitem__(i) -> {'image': uint8 HWC, 'label': np.int32}` and the
attributes `num_classes`, `class_names` and `labels` (all labels, so subsampling needs no image
decoding). Sources are read concurrently by grain's threads, so they must be thread-safe.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from locvit.configs import datasets
from locvit.data import decoded
from locvit.data.config import checked_data_config, parse_split

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
_FOLDER_LAYOUT = "ROOT/<split>/<class_name>/*.{jpg,jpeg,png} (e.g. ROOT/train/cat/0001.jpg)"


class CorruptImageError(ValueError):
  """An image file could not be read or decoded; the message names the file."""


class DatasetNotPreparedError(FileNotFoundError):
  """A TFDS dataset is not prepared (in ArrayRecord format) in the given data_dir."""


def _example(image: np.ndarray, label: int) -> dict[str, np.ndarray]:
  return {"image": image, "label": np.int32(label)}


# ----------------------------------------------------------------------------- digits


class DigitsSource:
  """scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes), shipped offline.

  Pixels 0..16 are mapped to uint8 with round(x * 255 / 16); images are (8, 8, 1).
  Split: `sklearn.model_selection.train_test_split(test_size=0.2, stratify=y,
  random_state=0)`, i.e. a fixed stratified 80/20 split (1,437 train / 360 test); each split
  keeps the original dataset order.
  """

  SEED = 0
  TEST_FRACTION = 0.2

  def __init__(self, split: str = "train") -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in ("train", "test"):
      raise ValueError(f"DigitsSource split={split!r} is not one of ['test', 'train']")
    digits = load_digits()
    all_idx = np.arange(len(digits.target))
    train_idx, test_idx = train_test_split(
      all_idx,
      test_size=self.TEST_FRACTION,
      stratify=digits.target,
      random_state=self.SEED,
    )
    idx = np.sort(train_idx if split == "train" else test_idx)
    images = np.rint(digits.images[idx] * (255.0 / 16.0)).astype(np.uint8)
    self.images = images[..., None]
    self.labels = digits.target[idx].astype(np.int32)
    self.split = split
    self.num_classes = 10
    self.class_names = [str(i) for i in range(10)]

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return _example(self.images[index], self.labels[index])

  def __repr__(self) -> str:
    return f"DigitsSource(split={self.split!r}, n={len(self)})"


# ----------------------------------------------------------------------------- image folder


# 16-bit greyscale PNG/TIFF (PIL opens them as I;16* or as 32-bit I). PIL's convert("RGB") clips
# them at 255, so a mid-grey 16-bit image would train as white. (16-bit RGB PNGs open as 8-bit RGB.)
_WIDE_INTEGER_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _gray16_to_rgb8(pixels: np.ndarray, path) -> np.ndarray:
  """16-bit grey levels scaled to 8 bits (v / 257, rounded: 0 -> 0, 65535 -> 255), as RGB."""
  if pixels.min() < 0 or pixels.max() > 65535:
    raise CorruptImageError(
      f"cannot decode image file {path!r}: 32-bit pixel values outside 0..65535; save it as 8- or "
      "16-bit"
    )
  grey = np.round(pixels.astype(np.float64) / 257.0).astype(np.uint8)
  return np.repeat(grey[..., None], 3, axis=-1)


def _bound(text: str | None, n: int, default: int) -> int:
  """A slice bound as an index into n examples: a percentage rounds to the nearest example; a
  negative bound counts from the end, and bounds are clipped to [0, n], as Python slices do."""
  if text is None:
    return default
  value = int(text.rstrip("%"))
  if text.endswith("%"):
    value = math.floor(abs(value) * n / 100 + 0.5) * (1 if value >= 0 else -1)
  if value < 0:
    value += n
  return min(max(value, 0), n)


def stratified_order(labels: np.ndarray | Sequence[int]) -> np.ndarray:
  """The examples in the order that split slices cut: each class spread evenly over it.

  The r-th of the n_c examples of class c (in source order) sits at (r + 0.5) / n_c; ties go to
  the lower label. So any run of k consecutive positions holds each class in proportion to its
  size (within one example), and slices at the same bounds partition the split.
  """
  labels = np.asarray(labels)
  if labels.size == 0:
    return np.zeros((0,), np.int64)
  counts = np.bincount(labels)
  ranks = np.empty(len(labels), np.int64)
  for c in np.flatnonzero(counts):
    idx = np.flatnonzero(labels == c)
    ranks[idx] = np.arange(len(idx))
  position = (ranks + 0.5) / counts[labels]
  return np.lexsort((labels, position))


def split_slice(labels: np.ndarray | Sequence[int], start: str | None, stop: str | None):
  """The sorted indices of ``split[start:stop]`` over examples with ``labels``: the slice of
  ``stratified_order``, so a class-stratified subset that depends on the labels alone (the same
  on any number of processes or devices, for any seed)."""
  labels = np.asarray(labels)
  n = len(labels)
  order = stratified_order(labels)
  return np.sort(order[_bound(start, n, 0) : _bound(stop, n, n)])


def decode_image(path: str) -> np.ndarray:
  """Decodes an image file to RGB uint8 HWC (PIL, as timm's loader: ``convert('RGB')``; 16-bit
  greyscale scaled to 8 bits); raises CorruptImageError naming the file."""
  try:
    with Image.open(path) as img:
      if img.mode in _WIDE_INTEGER_MODES:
        return _gray16_to_rgb8(np.asarray(img), path)
      return np.asarray(img.convert("RGB"), dtype=np.uint8)
  except CorruptImageError:
    raise
  except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... on bad files.
    raise CorruptImageError(f"cannot decode image file {path!r} ({type(e).__name__}: {e})") from e


class ImageFolderSource:
  """Images laid out as ROOT/<split>/<class>/*.{jpg,jpeg,png}, decoded with PIL to RGB uint8.

  Classes are the sorted subdirectory names; files are sorted within each class, so index
  order (and `labels`) is deterministic. Extensions are matched case-insensitively.

  ``split`` takes TFDS's slice syntax: ``test[:500]``, ``train[:90%]``, ``train[90%:]``,
  ``train[-10%:]``. A slice selects a class-stratified subset of ROOT/<name> that depends only on
  the files (``split_slice``): each class keeps its share of the slice (within one example), the
  classes' first files first, and ``train[:90%]`` and ``train[90%:]`` partition the split. The
  source keeps every class (``num_classes``), even one the slice leaves empty.

  Corrupt files are found lazily (when read), not by decoding everything up front:
    * on_corrupt='error': reading raises `CorruptImageError` naming the file.
    * on_corrupt='skip': the read deterministically substitutes the next readable index
      (i+1, i+2, ... wrapping around), so batches keep their fixed size. Each corrupt path is
      counted once (`num_skipped`, `skipped_paths`) and a warning with the count and the first
      few paths is logged at the 1st, 2nd, 4th, 8th, ... file found. `get_checked(i)` also
      reports whether a substitute was returned; the eval pipeline uses it to mask such
      examples out, so each readable eval example is still counted exactly once.
  """

  def __init__(self, root: str | os.PathLike, split: str, on_corrupt: str = "error") -> None:
    if on_corrupt not in ("error", "skip"):
      raise ValueError(f"on_corrupt={on_corrupt!r} is not one of ['error', 'skip']")
    self.root = Path(root)
    self.split = split
    self.on_corrupt = on_corrupt
    folder, start, stop = parse_split(split)
    split_dir = self.root / folder
    if not self.root.is_dir():
      raise FileNotFoundError(
        f"image folder root {str(self.root)!r} does not exist; expected {_FOLDER_LAYOUT}"
      )
    if not split_dir.is_dir():
      raise FileNotFoundError(
        f"image folder split directory {str(split_dir)!r} does not exist; expected {_FOLDER_LAYOUT}"
      )
    class_dirs = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    if not class_dirs:
      raise FileNotFoundError(
        f"no class subdirectories in {str(split_dir)!r}; expected {_FOLDER_LAYOUT}"
      )
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(class_dirs):
      class_dir = split_dir / name
      files = sorted(
        e.name
        for e in os.scandir(class_dir)
        if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS)
      )
      if not files:
        raise FileNotFoundError(
          f"class directory {str(class_dir)!r} has no .jpg/.jpeg/.png files; "
          f"expected {_FOLDER_LAYOUT}"
        )
      paths.extend(str(class_dir / f) for f in files)
      labels.extend([label] * len(files))
    self.labels = np.asarray(labels, dtype=np.int32)
    if (start, stop) != (None, None):
      keep = split_slice(self.labels, start, stop)
      paths, self.labels = [paths[i] for i in keep], self.labels[keep]
    self.paths = paths
    self.class_names = class_dirs
    self.num_classes = len(class_dirs)
    self._lock = threading.Lock()
    self._skipped: dict[str, str] = {}  # path -> error message, insertion ordered.

  def __len__(self) -> int:
    return len(self.paths)

  def __getstate__(self) -> dict:  # A worker process gets its own lock (data.num_workers).
    return {k: v for k, v in self.__dict__.items() if k != "_lock"}

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state, _lock=threading.Lock())

  def __repr__(self) -> str:
    return (
      f"ImageFolderSource(root={str(self.root)!r}, split={self.split!r}, n={len(self)}, "
      f"classes={self.num_classes})"
    )

  @property
  def num_skipped(self) -> int:
    """Number of distinct corrupt files met so far (on_corrupt='skip')."""
    with self._lock:
      return len(self._skipped)

  @property
  def skipped_paths(self) -> list[str]:
    """Paths of the distinct corrupt files met so far, in the order found (on_corrupt='skip')."""
    with self._lock:
      return list(self._skipped)

  def decode(self, index: int) -> np.ndarray:
    """Decodes file `index` to RGB uint8 HWC; raises CorruptImageError naming the file."""
    return decode_image(self.paths[index])

  def get_checked(self, index: int) -> tuple[dict[str, np.ndarray], bool]:
    """Returns (example, ok); ok is False when a substitute for a corrupt file was returned."""
    index = int(index)
    n = len(self.paths)
    if not -n <= index < n:
      raise IndexError(f"index {index} out of range for {n} examples")
    index %= n
    for step in range(n):
      i = (index + step) % n
      try:
        return _example(self.decode(i), self.labels[i]), step == 0
      except CorruptImageError as e:
        if self.on_corrupt == "error":
          raise CorruptImageError(
            f"{e}; --config.data.on_corrupt=skip reads the next readable file in its place"
          ) from e.__cause__
        self._record_skip(self.paths[i], str(e))
    raise CorruptImageError(f"every image under {str(self.root / self.split)!r} is unreadable")

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return self.get_checked(index)[0]

  def _record_skip(self, path: str, message: str) -> None:
    with self._lock:
      if path in self._skipped:
        return
      self._skipped[path] = message
      count = len(self._skipped)
      first = list(self._skipped)[:5]
    if count & (count - 1) == 0:  # Powers of two: informative without flooding the log.
      logger.warning(
        "%r: skipped %d corrupt/unreadable image file(s) so far (substituting the next "
        "readable one); first: %s",
        self,
        count,
        first,
      )


# ----------------------------------------------------------------------------- TFDS


# What the `tfds` command line needs besides TensorFlow: tfds 4.9.10 imports apache_beam and
# mlcroissant when it starts, and importlib_resources when it builds (README, "Data").
TFDS_BUILD_PACKAGES = "tensorflow tensorflow-datasets apache-beam mlcroissant importlib_resources"


def _prepare_hint(name: str, data_dir: str) -> str:
  return (
    "Prepare it once in ArrayRecord format (locvit reads TFDS through tfds.data_source: random "
    "access, no TensorFlow at training time), on a machine with network access for datasets "
    f"that download:\n  pip install {TFDS_BUILD_PACKAGES}\n  tfds build {name} "
    f"--data_dir={data_dir} --file_format=array_record\nor in Python:\n  tfds.builder({name!r}, "
    f"data_dir={data_dir!r}).download_and_prepare(file_format='array_record')\n"
    "Datasets with manual files read them from DATA_DIR/downloads/manual (imagenet2012: "
    "ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar). Prepared elsewhere, copy the data_dir "
    "here and pass --data=tfds:DATA_DIR (data.data_dir)."
  )


def _convert_hint(name: str, where: str) -> str:
  return (
    "Convert it in place with tfds's own tool (no download; the packages: pip install "
    f"{TFDS_BUILD_PACKAGES}):\n  tfds convert_format --dataset_version_dir={where} "
    "--out_file_format=array_record\nor build it again into another, empty data_dir (tfds does "
    f"not rebuild over a prepared dataset):\n  tfds build {name} --data_dir=NEW_DATA_DIR "
    "--file_format=array_record"
  )


class TfdsSource:
  """A prepared TFDS dataset read through `tfds.data_source` (ArrayRecord, no TensorFlow).

  Never downloads: if the dataset is not prepared under `data_dir`, construction fails at once
  with `DatasetNotPreparedError` saying where it looked and how to prepare it. Examples must
  have 'image' and 'label' features; 2-D images get a channel axis.
  """

  def __init__(self, name: str, split: str, data_dir: str | os.PathLike | None = None) -> None:
    import tensorflow_datasets as tfds  # Lazy: only users of TFDS pay its import time.

    self.name, self.split = name, split
    try:
      builder = tfds.builder(name, data_dir=data_dir, try_gcs=False)
    except tfds.core.registered.DatasetNotFoundError as e:
      base = name.split("/")[0].split(":")[0]
      try:  # Community datasets are left out: listing them imports TensorFlow.
        known = tfds.list_builders(with_community_datasets=False)
      except Exception:
        known = []
      close = difflib.get_close_matches(base, known, n=8)
      raise ValueError(
        f"data.name={name!r} is not a registered TFDS dataset; close matches: {close} "
        "(all names: tfds.list_builders())"
      ) from e
    where = str(builder.data_path)
    root_dir = str(builder.data_dir_root) if data_dir is None else str(data_dir)
    try:
      # Calls as_data_source directly: tfds.data_source(download=True) would try (and, offline,
      # retry for minutes) to download.
      self._ds = builder.as_data_source(split=split)
    except Exception as e:
      # builder.is_prepared()'s test, without the absl warning it logs before our error
      if not (builder.data_path / tfds.core.constants.DATASET_INFO_FILENAME).exists():
        raise DatasetNotPreparedError(
          f"TFDS dataset {name!r} is not prepared: looked for {where!r} (data_dir="
          f"{root_dir!r}) and found no prepared version {builder.version}. "
          + _prepare_hint(name, root_dir)
          + f"\nOr {datasets.folder_hint(name)}."
        ) from e
      file_format = builder.info.file_format
      random_access = getattr(file_format, "value", file_format) in ("array_record", "parquet")
      raise ValueError(
        f"TFDS dataset {name!r} at {where!r} cannot be read as a random-access data "
        f"source (file format {getattr(file_format, 'value', file_format)}, split {split!r}): "
        f"{e}\n" + (_prepare_hint(name, root_dir) if random_access else _convert_hint(name, where))
      ) from e
    features = builder.info.features
    if "image" not in features or "label" not in features:
      raise ValueError(
        f"TFDS dataset {name!r} needs 'image' and 'label' features, has {list(features)}"
      )
    self.class_names = list(features["label"].names)
    self.num_classes = int(features["label"].num_classes)
    self._builder = builder
    self._labels: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self._ds)

  def __repr__(self) -> str:
    return f"TfdsSource(name={self.name!r}, split={self.split!r}, n={len(self)})"

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    ex = self._ds[int(index)]
    image = np.asarray(ex["image"], dtype=np.uint8)
    if image.ndim == 2:
      image = image[:, :, None]
    return _example(image, int(ex["label"]))

  @property
  def labels(self) -> np.ndarray:
    """All labels, read once on first use (decodes records; only subsampling needs this)."""
    if self._labels is None:
      self._labels = np.asarray([int(self._ds[i]["label"]) for i in range(len(self))], np.int32)
    return self._labels


# ----------------------------------------------------------------------------- subsets


def subsample_per_class(labels: np.ndarray | Sequence[int], fraction: float) -> np.ndarray:
  """Indices keeping the first int(n_c * fraction) examples (at least 1) of each class.

  "First" is in source order, as in ConViT's reference subsampling; the result is sorted, so
  it is deterministic and independent of any seed.
  """
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"data.train_fraction={fraction!r} must be in (0, 1]")
  labels = np.asarray(labels)
  if fraction == 1.0:
    return np.arange(len(labels))
  keep = []
  for c in np.unique(labels):
    idx = np.flatnonzero(labels == c)
    keep.append(idx[: max(1, int(len(idx) * fraction))])
  return np.sort(np.concatenate(keep)) if keep else np.zeros((0,), np.int64)


class SubsetSource:
  """An index-mapped view of a source (labels unchanged).

  Keeps the source's num_classes/class_names unless `num_classes` is given (class_limit), in
  which case class_names are the first `num_classes` names.
  """

  def __init__(self, source: Any, indices: np.ndarray, num_classes: int | None = None) -> None:
    self.source = source
    self.indices = np.asarray(indices, dtype=np.int64)
    self.labels = np.asarray(source.labels)[self.indices]
    self.num_classes = source.num_classes if num_classes is None else int(num_classes)
    self.class_names = list(source.class_names)[: self.num_classes]

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return self.source[int(self.indices[index])]

  def get_checked(self, index: int) -> tuple[dict[str, np.ndarray], bool]:
    """Returns (example, ok) from the underlying source; ok is always True if it cannot tell."""
    inner = int(self.indices[index])
    if hasattr(self.source, "get_checked"):
      return self.source.get_checked(inner)
    return self.source[inner], True

  def __repr__(self) -> str:
    return f"SubsetSource({self.source!r}, n={len(self)})"


def limit_classes(source: Any, class_limit: int) -> Any:
  """The examples of `source` with label < class_limit, as a source of class_limit classes.

  Source order is kept. Raises ValueError when class_limit exceeds the source's classes.
  """
  if not 1 <= class_limit <= source.num_classes:
    raise ValueError(
      f"data.class_limit={class_limit} must be in [1, {source.num_classes}]: it exceeds the "
      f"{source.num_classes} classes of {source!r}"
    )
  if class_limit == source.num_classes:
    return source
  keep = np.flatnonzero(np.asarray(source.labels) < class_limit)
  return SubsetSource(source, keep, num_classes=class_limit)


def _image_folder_split(cfg: Any, split: str) -> ImageFolderSource:
  """``ImageFolderSource`` of ``split``; a split folder that is missing is named with the config
  field that chose it and the folders there are (e.g. an ImageNet-style config's 'val' on a
  folder of train/ and test/)."""
  try:
    return ImageFolderSource(cfg.root, split, on_corrupt=cfg.on_corrupt)
  except FileNotFoundError as e:
    folder = parse_split(split)[0]
    root = Path(cfg.root)
    if not root.is_dir():  # e.g. a finished run's data moved: eval and analyze read it too
      hint = "data.root; --data=image_folder:DIR reads DIR instead"
      raise FileNotFoundError(f"{e} ({hint})") from None
    if (root / folder).is_dir():
      raise
    field = "train_split" if split == cfg.train_split else "eval_split"
    present = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    hint = ""
    train_folder = parse_split(cfg.train_split)[0]
    if len(present) == 2 and field == "eval_split" and train_folder in present:
      other = next(name for name in present if name != train_folder)
      hint = f"; --config.data.{field}={other} reads {other}/"
    raise FileNotFoundError(
      f"{e} (data.{field}={split!r}; {root} holds {', '.join(present) or 'no folder'}{hint})"
    ) from None


def make_source(data_config: Any, split: str) -> Any:
  """Builds the source for `split` (a split name, e.g. data_config.train_split).

  With data.class_limit = k every split keeps only the examples of labels < k (and reports k
  classes). Then, when `split == data_config.train_split` and train_fraction < 1, the source is
  wrapped in a per-class `SubsetSource`; `len()` of the result is the subsampled epoch length.
  A split whose decoded images fit data.decoded_cache_mb is decoded once and kept
  (`decoded.cache_decoded`).
  """
  cfg = checked_data_config(data_config)
  if cfg.source == "digits":
    source: Any = DigitsSource(split)
  elif cfg.source == "image_folder":
    source = _image_folder_split(cfg, split)
  else:
    source = TfdsSource(cfg.name, split, cfg.data_dir)
  if cfg.class_limit is not None:
    source = limit_classes(source, cfg.class_limit)
  if cfg.num_classes is not None and cfg.num_classes < source.num_classes:
    raise ValueError(
      f"data.num_classes={cfg.num_classes} is smaller than the {source.num_classes} "
      f"classes of {source!r}: a label past the head has no output; "
      f"--config.data.num_classes={source.num_classes} fits the head to them"
    )
  if split == cfg.train_split and cfg.train_fraction < 1.0:
    source = SubsetSource(source, subsample_per_class(source.labels, cfg.train_fraction))
  return decoded.cache_decoded(source, cfg.decoded_cache_mb, split)


def check_same_classes(train_source: Any, eval_source: Any) -> None:
  """Raises ValueError listing the differences when the splits' class lists differ: labels are
  indices into the sorted class list, so a missing, extra or renamed class shifts every label
  after it and the evaluation scores against the wrong classes."""
  train, evaluated = list(train_source.class_names), list(eval_source.class_names)
  if train == evaluated:
    return
  missing = [c for c in train if c not in evaluated]
  extra = [c for c in evaluated if c not in train]
  parts = []
  if missing and extra and len(missing) == len(extra):
    parts.append("renamed? " + ", ".join(f"{a!r} -> {b!r}" for a, b in zip(missing, extra)))
  else:
    if missing:
      parts.append(f"missing from the eval split: {missing}")
    if extra:
      parts.append(f"only in the eval split: {extra}")
  if not parts:
    parts.append(f"same names in another order: {train} vs {evaluated}")
  raise ValueError(
    f"train and eval class lists differ ({len(train)} vs {len(evaluated)} classes; "
    f"{train_source!r} vs {eval_source!r}): " + "; ".join(parts)
  )


def num_classes(data_config: Any, source: Any) -> int:
  """data.num_classes if set, else the source's class count."""
  return int(data_config.num_classes or source.num_classes)
