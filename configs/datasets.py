"""The datasets the paper configs train on, and where each is read from: one place for all.

A config names its dataset once, ``use_dataset(c, "cifar10")``, which sets ``c.data``'s name, class
count and splits and reads the data from an image folder when ``$CIFAR10_ROOT`` (``$CIFAR100_ROOT``,
``$SVHN_ROOT``, ``$TINYIMAGENET_ROOT``, ``$IMAGENET_ROOT``) names one, else from TFDS. The
image size and the normalisation stay the config's (the paper's). ``python -m locvit.main
--data=image_folder:DIR`` (or ``--data=DIR``) and ``--data=tfds[:DATA_DIR]`` switch any config
after it is loaded, through ``use_image_folder`` / ``use_tfds``. The folders are kept as given
(plain data); the config loader makes a relative one absolute at launch
(``locvit.run.config.with_absolute_paths``), so a run's saved ``config.json`` reads the same
folder from any directory.

An image folder is laid out as ``ROOT/<split>/<class>/*.{jpg,jpeg,png}``, with the split folders
named as in ``Dataset.folder_splits`` (``train`` and ``test``; ImageNet and Tiny-ImageNet:
``train`` and ``val``). TFDS split strings with a slice (``test[:500]``, ``train[:90%]``) keep
their slice on either source.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from typing import NamedTuple

import ml_collections


class Dataset(NamedTuple):
  """A dataset the shipped configs train on.

  Fields:
    name: ``data.name``: the TFDS name (also kept, as a label, when reading an image folder).
    num_classes: the class count (``data.num_classes``).
    env: the environment variable naming its image folder.
    tfds: whether TFDS has it (Tiny-ImageNet: only as an image folder).
    tfds_splits, folder_splits: the (train, eval) split names on each source.
    prepare: the command that writes its image folder, if locvit has one.
  """

  name: str
  num_classes: int
  env: str
  tfds: bool = True
  tfds_splits: tuple[str, str] = ("train", "test")
  folder_splits: tuple[str, str] = ("train", "test")
  prepare: str | None = None


DATASETS = {
  "cifar10": Dataset(
    "cifar10", 10, "CIFAR10_ROOT", prepare="python -m locvit.data.prepare cifar10 --out=DIR"
  ),
  "cifar100": Dataset(
    "cifar100", 100, "CIFAR100_ROOT", prepare="python -m locvit.data.prepare cifar100 --out=DIR"
  ),
  "svhn": Dataset("svhn_cropped", 10, "SVHN_ROOT"),
  "tinyimagenet": Dataset(
    "tiny_imagenet", 200, "TINYIMAGENET_ROOT", tfds=False, folder_splits=("train", "val")
  ),
  "imagenet": Dataset(
    "imagenet2012",
    1000,
    "IMAGENET_ROOT",
    tfds_splits=("train", "validation"),
    folder_splits=("train", "val"),
  ),
}


def find(name: str | None) -> Dataset | None:
  """The dataset whose ``data.name`` is ``name``, if it is one of ``DATASETS``."""
  return next((d for d in DATASETS.values() if d.name == name), None)


def folder_hint(name: str | None) -> str:
  """How to read dataset ``name`` from an image folder instead, as one sentence."""
  dataset = find(name)
  env = f" (or export {dataset.env}=DIR)" if dataset else ""
  train, test = dataset.folder_splits if dataset else ("train", "test")
  prepare = f"; `{dataset.prepare}` writes DIR" if dataset and dataset.prepare else ""
  return (
    f"read an image folder DIR/{train}/<class>/*.jpg, DIR/{test}/<class>/*.jpg instead with "
    f"--data=image_folder:DIR{env}{prepare}"
  )


def missing_root_hint(name: str | None) -> str:
  """How to give the image folder of dataset ``name`` that a config reads but was not given."""
  dataset = find(name)
  env = f" or export {dataset.env}=DIR" if dataset else ""
  prepare = f"; `{dataset.prepare}` writes DIR" if dataset and dataset.prepare else ""
  return f"give --data=image_folder:DIR{env}{prepare}"


def use_dataset(
  c: ml_collections.ConfigDict, dataset: str, *, source: str | None = None
) -> ml_collections.ConfigDict:
  """Points ``c.data`` at ``dataset`` (a key of ``DATASETS``): its name, class count and splits,
  read from the image folder in its environment variable when that is set (or ``source`` is
  'image_folder': the folder then must be set), else from TFDS."""
  d = DATASETS[dataset]
  c.data.name = d.name
  c.data.num_classes = d.num_classes
  c.data.source, c.data.root = "tfds", None
  c.data.train_split, c.data.eval_split = d.tfds_splits
  root = os.environ.get(d.env) or None
  if source == "image_folder" or root or not d.tfds:
    use_image_folder(c.data, root)
  return c


_SPLIT = re.compile(r"(?P<name>[^\[]*)(?P<slice>\[.*\])?")


def _renamed(split: str, names: dict[str, str]) -> str:
  match = _SPLIT.fullmatch(split)
  name = match["name"]
  return names.get(name, name) + (match["slice"] or "")


def _switch_splits(data: ml_collections.ConfigDict, to_folder: bool) -> None:
  d = find(data.name)
  if d is None:
    return
  tfds, folder = d.tfds_splits, d.folder_splits
  names = dict(zip(tfds, folder)) if to_folder else dict(zip(folder, tfds))
  data.train_split = _renamed(data.train_split, names)
  data.eval_split = _renamed(data.eval_split, names)


def use_image_folder(data: ml_collections.ConfigDict, root: str | None) -> None:
  """Reads ``data`` from the image folder ``root``: the dataset's folder split names, any slice
  (``test[:500]``) kept; the class count, image size and normalisation unchanged. ``root`` is
  kept as given: the config loader makes a relative one absolute at launch
  (``locvit.run.config.with_absolute_paths``)."""
  if data.get("source") != "image_folder":
    _switch_splits(data, to_folder=True)
  data.source = "image_folder"
  data.root = root


def use_tfds(data: ml_collections.ConfigDict, data_dir: str | None = None) -> None:
  """Reads ``data`` from TFDS (prepared in ``data_dir``, None: TFDS's default; kept as given, as
  ``use_image_folder``'s root), with the dataset's TFDS split names; the rest unchanged."""
  if data.get("source") == "image_folder":
    _switch_splits(data, to_folder=False)
  data.source, data.root = "tfds", None
  if data_dir is not None:
    data.data_dir = data_dir


def parse_data_flag(value: str) -> tuple[str, str | None]:
  """``--data``'s ``(source, location)``: ``image_folder:DIR`` or ``DIR`` -> ('image_folder', DIR);
  ``tfds`` or ``tfds:DATA_DIR`` -> ('tfds', DATA_DIR or None). Raises ValueError otherwise."""
  source, _, where = value.partition(":")
  if source == "tfds":
    return "tfds", where or None
  if source == "image_folder":
    if not where:
      raise ValueError("--data=image_folder needs its folder: --data=image_folder:DIR")
    return "image_folder", where
  if not value:
    raise ValueError("--data= is empty; give --data=image_folder:DIR, --data=DIR or --data=tfds")
  close = difflib.get_close_matches(source, ("image_folder", "tfds"), n=1)
  if where and close and not os.path.exists(value):  # tfsd:DIR is a typo, not a folder
    raise ValueError(
      f"--data={value}: {source!r} is not a source; did you mean {close[0]}? "
      "Give --data=image_folder:DIR, --data=DIR or --data=tfds[:DATA_DIR]"
    )
  return "image_folder", value


def apply_data_flag(config: ml_collections.ConfigDict, value: str) -> ml_collections.ConfigDict:
  """A copy of ``config`` reading its data as ``--data=value`` says (``parse_data_flag``)."""
  source, where = parse_data_flag(value)
  config = copy.deepcopy(config)
  if source == "tfds":
    use_tfds(config.data, where)
  else:
    use_image_folder(config.data, where)
  return config
