"""Decode once: a split that fits data.decoded_cache_mb is decoded on first read and kept."""

import logging

import numpy as np
import pytest
from PIL import Image

from locvit.data import decoded, default_data_config, make_eval_iterator, make_source
from locvit.data.sources import ImageFolderSource


def write_folder(root, per_class=3, size=(6, 5), corrupt=None):
  """A tiny ROOT/{train,test}/<class>/*.png folder; ``corrupt`` names one file to damage."""
  rng = np.random.default_rng(0)
  for split in ("train", "test"):
    for c in ("a", "b"):
      (root / split / c).mkdir(parents=True)
      for k in range(per_class):
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / split / c / f"{k}.png")
  if corrupt:
    (root / corrupt).write_bytes(b"not an image")
  return root


def folder_config(root, **fields):
  c = default_data_config()
  c.update(dict(source="image_folder", root=str(root), image_size=6, num_threads=1, prefetch=1))
  c.update(fields)
  return c


class CountingFolder(ImageFolderSource):
  """Counts decodes, so a test can see which reads came from the cache."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.decodes = 0

  def decode(self, index):
    self.decodes += 1
    return super().decode(index)


def test_each_image_is_decoded_once_and_read_back_unchanged(tmp_path):
  folder = CountingFolder(write_folder(tmp_path), "train")
  cached = decoded.cache_decoded(folder, budget_mb=1, split="train")
  assert isinstance(cached, decoded.DecodedCache) and folder.decodes == 1  # the size probe
  first = [cached[i] for i in range(len(cached))]
  assert folder.decodes == 1 + len(folder) and cached.num_cached == len(folder)
  again = [cached[i] for i in range(len(cached))]
  assert folder.decodes == 1 + len(folder)  # the second epoch decodes nothing
  for i, (a, b) in enumerate(zip(first, again, strict=True)):
    np.testing.assert_array_equal(a["image"], folder.decode(i))
    np.testing.assert_array_equal(b["image"], a["image"])
    assert b["label"] == a["label"] == folder.labels[i] and b["label"].dtype == np.int32
  assert cached[-1]["label"] == folder.labels[-1]
  with pytest.raises(IndexError, match="index 6 out of range for 6 examples"):
    cached[6]
  assert cached.class_names == ["a", "b"] and cached.num_skipped == 0  # the source's attributes


def test_a_split_over_the_budget_streams_with_one_line_naming_its_size_and_the_field(
  tmp_path, caplog
):
  folder = ImageFolderSource(write_folder(tmp_path, per_class=300, size=(40, 40)), "train")
  with caplog.at_level(logging.INFO, logger="locvit.data.decoded"):
    assert decoded.cache_decoded(folder, budget_mb=2, split="train") is folder
  assert [r.getMessage() for r in caplog.records] == [
    f"The train split streams from {folder!r}: decoded once it would take 2.9 MB, over "
    "data.decoded_cache_mb=2 (raise it to decode once and keep the images in memory)."
  ]
  assert decoded.cache_decoded(folder, budget_mb=0, split="train") is folder


def test_make_source_caches_within_the_budget_and_eval_reads_only_its_share(tmp_path):
  root = write_folder(tmp_path)
  train = make_source(folder_config(root), "train")
  assert isinstance(train, decoded.DecodedCache)
  assert not isinstance(
    make_source(folder_config(root, decoded_cache_mb=0), "train"), decoded.DecodedCache
  )
  test = make_source(folder_config(root), "test")
  evaluation = make_eval_iterator(
    folder_config(root), test, local_batch_size=2, process_index=1, process_count=2
  )
  list(evaluation)
  assert np.flatnonzero(test._state).tolist() == [0, 3, 4, 5]  # row 0: its padding-shape probe


def test_a_corrupt_files_substitute_is_cached_and_still_flagged(tmp_path):
  root = write_folder(tmp_path, corrupt="train/a/1.png")
  folder = CountingFolder(root, "train", on_corrupt="skip")
  cached = decoded.DecodedCache(folder, (6, 5, 3))
  for _ in range(2):
    example, ok = cached.get_checked(1)
    assert not ok and example["label"] == 0
    np.testing.assert_array_equal(example["image"], folder.decode(2))
  assert cached.get_checked(2)[1]


def test_an_image_of_another_size_is_returned_uncached(tmp_path):
  root = write_folder(tmp_path)
  Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(root / "train" / "b" / "2.png")
  folder = CountingFolder(root, "train")
  cached = decoded.cache_decoded(folder, budget_mb=1, split="train")
  assert cached[5]["image"].shape == (9, 9, 3) and cached[5]["image"].shape == (9, 9, 3)
  assert cached.num_cached == 0 and folder.decodes == 3
