"""A plan's data, checked in seconds before any run: the folder or TFDS copy each row reads, its
size against the batch (budget plans) or the paper's dataset (protocol plans), its format, and
the data in words for the plan and its report.

Every paper's code trained and tested on the original CIFAR-10 images. A paper-protocol plan
therefore takes a lossless image folder (PNG, ``python -m locvit.data.prepare``'s default) or
TFDS, and refuses a JPEG folder unless told ``--allow_lossy_data``: a number from a lossy copy
cannot confirm or refute the paper's, and its report's title says so.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections

from locvit.configs.common import complete_config
from locvit.data.config import parse_split
from locvit.reproduce.plans import ReproduceError

DATA_HELP = "docs/data_preparation.md"
LAYOUT = "DIR/train/<class>/*.png, DIR/test/<class>/*.png"
LOSSLESS_WAYS = (
  "prepare a lossless PNG folder (python -m locvit.data.prepare cifar10 --out=DIR, then "
  "--data=image_folder:DIR) or read TFDS (--data=tfds)"
)
EXTENSION_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg"}


def check_data(config: ml_collections.ConfigDict, row_name: str) -> None:
  """Fails in seconds, before any run, when a row's dataset is not where its config reads it."""
  data = complete_config(config).data
  if data.source == "image_folder":
    root = data.root
    if not root:
      raise ReproduceError(
        f"row {row_name!r} reads CIFAR-10 from an image folder but $CIFAR10_ROOT is not set. "
        f"Prepare it as described in {DATA_HELP} and `export CIFAR10_ROOT=DIR` ({LAYOUT}) or "
        "pass --data=image_folder:DIR, or pass --data=tfds to read the TFDS copy."
      )
    folders = [parse_split(s)[0] for s in (data.train_split, data.eval_split)]  # 'test[:500]'
    missing = [s for s in folders if not os.path.isdir(f"{root}/{s}")]
    if missing:
      raise ReproduceError(
        f"row {row_name!r}: no {' or '.join(missing)} folder in {root}. Prepare "
        f"CIFAR-10 as described in {DATA_HELP} ({LAYOUT})."
      )
  elif data.source == "tfds":
    from locvit.data.sources import DatasetNotPreparedError, TfdsSource

    for split in (data.train_split, data.eval_split):
      try:
        TfdsSource(data.name, split, data.data_dir)
      except DatasetNotPreparedError as e:
        raise ReproduceError(f"row {row_name!r}: {e}") from e


@dataclasses.dataclass(frozen=True)
class FolderContents:
  """What a row's image folder holds: its training images and the formats of both splits."""

  train_images: int
  formats: frozenset[str]  # 'png', 'jpeg'

  @property
  def lossy(self) -> bool:
    """Whether any image of either split is a JPEG."""
    return "jpeg" in self.formats


def folder_contents(config: ml_collections.ConfigDict) -> FolderContents | None:
  """The contents of ``config``'s image folder, listed (None: not an image folder, or one the run
  itself refuses: missing, or without class folders)."""
  from locvit.data.sources import ImageFolderSource

  data = complete_config(config).data
  if data.source != "image_folder" or not data.root:
    return None
  try:
    train, test = (ImageFolderSource(data.root, s) for s in (data.train_split, data.eval_split))
  except (FileNotFoundError, ValueError):
    return None
  formats = {EXTENSION_FORMATS[os.path.splitext(p)[1].lower()] for p in train.paths + test.paths}
  return FolderContents(len(train), frozenset(formats))


def check_batches(plan: dict[str, Any], configs: dict[str, Any]) -> None:
  """A row whose image folder gives fewer training images than its batch is refused before any
  probe (the run's own refusal names ``--config.batch_size``, which this command does not take)."""
  from locvit.data.sources import make_source

  if plan.get("protocol"):  # refused unless the folder holds the paper's dataset
    return
  for row, config in configs.items():
    complete = complete_config(config)
    data, batch = complete.data, complete.batch_size
    if data.source != "image_folder" or not data.root:
      continue
    try:  # one listing of the folder (check_data has refused a bad split or a missing folder)
      count = len(make_source(data, data.train_split))
    except FileNotFoundError:  # no class folders or no images: the run itself refuses it
      continue
    if count < batch:
      share = f"data.train_fraction={data.train_fraction:g} of " if data.train_fraction < 1 else ""
      raise ReproduceError(
        f"row {row!r}: {data.root} gives {count} training images ({share}its "
        f"{data.train_split!r} split), fewer than the row's batch of {batch}: the plan is made "
        f"for CIFAR-10 ({DATA_HELP}). On your own images: python -m locvit.main "
        f"--config={plan['rows'][row]['config']} --data=image_folder:{data.root} "
        f"--config.batch_size={count} --workdir=DIR"
      )


def check_protocol_data(
  plan: dict[str, Any], configs: dict[str, Any], allow_lossy_data: bool = False
) -> bool:
  """A paper-protocol plan trains the paper's epochs of the whole CIFAR-10 and sets its steps by
  that size: a folder of another size is refused, not trained for those steps. A JPEG folder is
  refused unless ``allow_lossy_data``. Returns whether a row reads lossy data."""
  lossy = False
  for row, config in configs.items():
    spec, contents = plan["rows"][row], folder_contents(config)
    if contents is None:
      continue
    expected = round(spec["paper_train_examples"] * complete_config(config).data.train_fraction)
    if contents.train_images != expected:
      raise ReproduceError(
        f"row {row!r}: {config.data.root} holds {contents.train_images:,} training images, not "
        f"the {expected:,} of the paper's dataset: a paper-protocol plan trains the paper's "
        "epochs of the whole dataset, its steps set by that size. On your own images: python -m "
        f"locvit.main --config={spec['config']} --data=image_folder:{config.data.root} "
        "--workdir=DIR"
      )
    if contents.lossy and not allow_lossy_data:
      raise ReproduceError(
        f"row {row!r}: {config.data.root} holds JPEG images, a lossy copy of the original "
        f"CIFAR-10 the papers trained and tested on: {LOSSLESS_WAYS}; or pass --allow_lossy_data "
        "to train on the JPEG copy anyway (the report's title then says so)"
      )
    lossy |= contents.lossy
  return lossy


def describe_data(config: ml_collections.ConfigDict) -> str:
  """What the row trains on, in words: the papers used the original CIFAR-10."""
  data = complete_config(config).data
  if data.source == "image_folder":
    return describe_folder(data, folder_contents(config))
  if data.source == "tfds":
    return f"TFDS {data.name} (the original images)"
  if data.source == "digits":
    return "scikit-learn's 8x8 digits"
  return f"{data.name} ({data.source})"


def describe_folder(data: ml_collections.ConfigDict, contents: FolderContents | None) -> str:
  """An image folder in words: lossless PNG (the original images), a lossy JPEG copy, or one not
  read yet (its root unset or missing)."""
  share = f"{data.train_fraction:.0%} of the training set"
  if contents is None:
    return (
      f"the CIFAR-10 image folder {data.root or '$CIFAR10_ROOT'} ({share}; not read yet: a "
      "protocol plan takes lossless PNG, and JPEG only with --allow_lossy_data)"
    )
  if not contents.lossy:
    return (
      f"CIFAR-10 as lossless PNG (image folder {data.root}, {share}): the original images, as "
      "the papers trained on"
    )
  return (
    f"the CIFAR-10 JPEG copy (image folder {data.root}, lossy, {share}): the papers trained on "
    "the original CIFAR-10, and the JPEG copy costs some accuracy"
  )
