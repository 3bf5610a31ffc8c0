"""locvit data: sources (digits, image folder, TFDS), augmentation and grain pipelines."""

# Plain data beside the shipped configs (which must not import JAX); the library names stay.
from locvit.configs.defaults import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD
from locvit.data import autoaugment
from locvit.data.augment import (
  build_eval_transform,
  build_train_transform,
  list_ops,
  list_recipes,
  register_op,
  register_recipe,
)
from locvit.data.config import (
  default_data_config,
  validate_data_config,
)
from locvit.data.pipeline import (
  EvalIterable,
  examples_per_epoch,
  make_eval_iterator,
  make_index_iterator,
  make_train_dataset,
  make_train_iterator,
  num_eval_batches,
)
from locvit.data.sources import (
  CorruptImageError,
  DatasetNotPreparedError,
  DigitsSource,
  ImageFolderSource,
  SubsetSource,
  TfdsSource,
  check_same_classes,
  limit_classes,
  make_source,
  num_classes,
  subsample_per_class,
)

__all__ = [
  "CIFAR10_MEAN",
  "CIFAR10_STD",
  "IMAGENET_MEAN",
  "IMAGENET_STD",
  "CorruptImageError",
  "DatasetNotPreparedError",
  "DigitsSource",
  "EvalIterable",
  "ImageFolderSource",
  "SubsetSource",
  "TfdsSource",
  "autoaugment",
  "build_eval_transform",
  "build_train_transform",
  "check_same_classes",
  "default_data_config",
  "examples_per_epoch",
  "limit_classes",
  "list_ops",
  "list_recipes",
  "make_eval_iterator",
  "make_index_iterator",
  "make_source",
  "make_train_dataset",
  "make_train_iterator",
  "num_classes",
  "num_eval_batches",
  "register_op",
  "register_recipe",
  "subsample_per_class",
  "validate_data_config",
]
