"""Tests for locvit.data: sources, augmentation ops, grain pipelines and config validation."""

import os
import sys
import time
from pathlib import Path

import data_fixtures
import grain
import numpy as np
import pytest
from PIL import Image

from locvit import data as D
from locvit.data import augment as A

cifar10_folder = data_fixtures.cifar10_folder  # Session fixture: extracted CIFAR-10 JPEG folder.

CIFAR_CLASSES = [
  "airplane",
  "automobile",
  "bird",
  "cat",
  "deer",
  "dog",
  "frog",
  "horse",
  "ship",
  "truck",
]


def _cfg(**overrides):
  cfg = D.default_data_config()
  cfg.num_threads = 2
  cfg.prefetch = 2
  for k, v in overrides.items():
    cfg[k] = v
  return cfg


class IndexSource:
  """Fake source whose 4x4 images encode their own index (recoverable after normalisation)."""

  def __init__(self, n: int, num_classes: int = 10):
    self.n = n
    self.labels = (np.arange(n) % num_classes).astype(np.int32)
    self.num_classes = num_classes
    self.class_names = [str(i) for i in range(num_classes)]

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    i = int(i)
    image = np.zeros((4, 4, 3), np.uint8)
    image[..., 0], image[..., 1] = i // 256, i % 256
    return {"image": image, "label": self.labels[i]}


def _index_cfg(**overrides):
  # Identity transform, so indices can be read back from the (uint8) batches.
  return _cfg(
    image_size=4, train_augment="none", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), **overrides
  )


def _indices(batch) -> np.ndarray:
  px = batch["image"][:, 0, 0, :2].astype(np.int64)
  return px[:, 0] * 256 + px[:, 1]


def _take(it, k):
  return [next(it) for _ in range(k)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      assert x[k].dtype == y[k].dtype
      np.testing.assert_array_equal(x[k], y[k])


# ----------------------------------------------------------------------------- digits


def test_digits_shapes_range_split_sizes():
  train, test = D.DigitsSource("train"), D.DigitsSource("test")
  assert (len(train), len(test)) == (1437, 360)
  ex = train[0]
  assert ex["image"].shape == (8, 8, 1) and ex["image"].dtype == np.uint8
  assert ex["label"].dtype == np.int32 and ex["label"].shape == ()
  assert train.images.min() == 0 and train.images.max() == 255
  assert train.num_classes == 10 and train.class_names == [str(i) for i in range(10)]
  # Pixel mapping x * 255 / 16 rounded: only 17 distinct values.
  assert set(np.unique(train.images)) <= {round(v * 255 / 16) for v in range(17)}


def test_digits_deterministic_and_stratified():
  a, b = D.DigitsSource("train"), D.DigitsSource("train")
  np.testing.assert_array_equal(a.images, b.images)
  np.testing.assert_array_equal(a.labels, b.labels)
  test = D.DigitsSource("test")
  tr_counts = np.bincount(a.labels, minlength=10)
  te_counts = np.bincount(test.labels, minlength=10)
  frac = te_counts / (tr_counts + te_counts)
  assert np.all(np.abs(frac - 0.2) < 0.02), frac
  # Train and test images are different examples: no test image row appears in train (digits has
  # few exact duplicates, so compare the split sizes of the union instead of pairwise equality).
  assert len(a) + len(test) == 1797


def test_digits_bad_split():
  with pytest.raises(ValueError, match="split='validation'"):
    D.DigitsSource("validation")


# ----------------------------------------------------------------------------- image folder


def test_image_folder_reads_cifar10(cifar10_folder):
  train = D.ImageFolderSource(cifar10_folder, "train")
  test = D.ImageFolderSource(cifar10_folder, "test")
  assert train.class_names == CIFAR_CLASSES == sorted(CIFAR_CLASSES)
  assert (len(train), len(test)) == (50_000, 10_000)
  np.testing.assert_array_equal(np.bincount(train.labels), [5000] * 10)
  np.testing.assert_array_equal(np.bincount(test.labels), [1000] * 10)
  assert train.paths == sorted(train.paths)  # Classes sorted and files sorted within classes.
  for i in (0, 12_345, 49_999):
    ex = train[i]
    assert ex["image"].shape == (32, 32, 3) and ex["image"].dtype == np.uint8
    assert int(ex["label"]) == i // 5000
    assert Path(train.paths[i]).parent.name == CIFAR_CLASSES[i // 5000]


def test_image_folder_layout_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
    D.ImageFolderSource(tmp_path / "nope", "train")
  with pytest.raises(FileNotFoundError, match=r"train.*ROOT/<split>/<class_name>"):
    D.ImageFolderSource(tmp_path, "train")
  (tmp_path / "train" / "cat").mkdir(parents=True)
  (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
  with pytest.raises(FileNotFoundError, match=r"cat.*no \.jpg/\.jpeg/\.png"):
    D.ImageFolderSource(tmp_path, "train")


@pytest.fixture
def corrupt_folder(cifar10_folder, tmp_path):
  root = data_fixtures.copy_classes(cifar10_folder, tmp_path / "small", ["bird", "cat"], n=5)
  good = sorted((root / "train" / "bird").iterdir())[0]
  # A truncated JPEG, a garbage .png, an upper-case extension and a non-image file.
  (root / "train" / "bird" / "zz_truncated.jpg").write_bytes(good.read_bytes()[:300])
  (root / "train" / "cat" / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)
  (root / "train" / "cat" / "UPPER.JPG").write_bytes(good.read_bytes())
  (root / "train" / "cat" / "readme.txt").write_text("ignored")
  return root


def test_image_folder_listing_case_insensitive(corrupt_folder):
  src = D.ImageFolderSource(corrupt_folder, "train")
  names = [Path(p).name for p in src.paths]
  assert "UPPER.JPG" in names and "readme.txt" not in names
  assert len(src) == 13 and np.bincount(src.labels).tolist() == [6, 7]


def test_corrupt_error_mode_names_path(corrupt_folder):
  src = D.ImageFolderSource(corrupt_folder, "train", on_corrupt="error")
  bad = [i for i, p in enumerate(src.paths) if "truncated" in p or "garbage" in p]
  assert len(bad) == 2
  for i in bad:
    with pytest.raises(D.CorruptImageError, match=src.paths[i]):
      src[i]
  # The error also surfaces, naming the file, through the threaded pipeline.
  cfg = _cfg(source="image_folder", root=str(corrupt_folder), image_size=32)
  it = D.make_train_iterator(cfg, src, seed=0, local_batch_size=13)
  with pytest.raises(D.CorruptImageError, match=r"zz_truncated\.jpg|garbage\.png"):
    next(it)


def test_corrupt_skip_mode(corrupt_folder):
  src = D.ImageFolderSource(corrupt_folder, "train", on_corrupt="skip")
  bad = {i for i, p in enumerate(src.paths) if "truncated" in p or "garbage" in p}
  for i in range(len(src)):
    ex, ok = src.get_checked(i)
    assert ok == (i not in bad)
    assert ex["image"].shape == (32, 32, 3)
    if i in bad:  # Deterministic substitute: the next readable index (wrapping).
      j = (i + 1) % len(src)
      while j in bad:
        j = (j + 1) % len(src)
      np.testing.assert_array_equal(ex["image"], src[j]["image"])
  assert src.num_skipped == 2  # Each corrupt file counted once, even when read again.
  src[min(bad)]
  assert src.num_skipped == 2 and len(src.skipped_paths) == 2
  cfg = _cfg(source="image_folder", root=str(corrupt_folder), image_size=32, on_corrupt="skip")
  # Train batches keep their fixed size; eval masks the substitutes out.
  batch = next(D.make_train_iterator(cfg, src, seed=0, local_batch_size=13))
  assert batch["image"].shape == (13, 32, 32, 3)
  masks = [b["mask"] for b in D.make_eval_iterator(cfg, src, local_batch_size=4)]
  assert all(m.shape == (4,) for m in masks)
  assert int(np.concatenate(masks).sum()) == len(src) - 2


# ----------------------------------------------------------------------------- subsampling


def test_subsample_per_class_exact_counts_first_in_order():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 5, size=1000)
  labels[labels == 4] = 3  # Class 4 empty; classes of different sizes.
  labels[:2] = 4  # Class 4 has 2 examples: int(2 * 0.1) = 0 -> kept at 1.
  idx = D.subsample_per_class(labels, 0.1)
  np.testing.assert_array_equal(idx, D.subsample_per_class(labels, 0.1))
  assert np.all(np.diff(idx) > 0)
  for c in np.unique(labels):
    members = np.flatnonzero(labels == c)
    kept = idx[labels[idx] == c]
    np.testing.assert_array_equal(kept, members[: max(1, int(len(members) * 0.1))])
  np.testing.assert_array_equal(D.subsample_per_class(labels, 1.0), np.arange(1000))
  with pytest.raises(ValueError, match="train_fraction"):
    D.subsample_per_class(labels, 0.0)


def test_make_source_applies_train_fraction_to_train_only():
  cfg = _cfg(train_fraction=0.25)
  train, test = D.make_source(cfg, "train"), D.make_source(cfg, "test")
  full = D.DigitsSource("train")
  counts = np.bincount(full.labels)
  assert len(train) == sum(int(n * 0.25) for n in counts) == D.examples_per_epoch(train)
  assert len(test) == 360 and train.num_classes == 10
  np.testing.assert_array_equal(np.bincount(train.labels), [int(n * 0.25) for n in counts])
  first = np.flatnonzero(full.labels == full.labels[0])[0]
  np.testing.assert_array_equal(train[0]["image"], full[first]["image"])


# ----------------------------------------------------------------------------- train pipeline


def test_train_iterator_shapes_and_dtypes():
  cfg = _cfg(train_augment="crop_flip", crop_padding=1)
  batch = next(D.make_train_iterator(cfg, D.make_source(cfg, "train"), seed=0, local_batch_size=16))
  assert set(batch) == {"image", "label"}
  # uint8 crosses to the device; the train step normalises (device_augment.normalize)
  assert batch["image"].shape == (16, 8, 8, 1) and batch["image"].dtype == np.uint8
  assert batch["label"].shape == (16,) and batch["label"].dtype == np.int32
  assert isinstance(
    D.make_train_iterator(cfg, D.DigitsSource(), seed=0, local_batch_size=4), grain.DatasetIterator
  )


@pytest.mark.parametrize("augment", ["crop_flip", "rrc_flip"])
def test_train_iterator_deterministic_and_seed_dependent(augment):
  cfg = _cfg(train_augment=augment, crop_padding=2, image_size=8)
  src = D.DigitsSource("train")
  a = _take(D.make_train_iterator(cfg, src, seed=3, local_batch_size=32), 3)
  b = _take(D.make_train_iterator(cfg, src, seed=3, local_batch_size=32), 3)
  c = _take(D.make_train_iterator(cfg, src, seed=4, local_batch_size=32), 3)
  _assert_batches_equal(a, b)
  assert not np.array_equal(a[0]["label"], c[0]["label"])
  assert not np.array_equal(a[0]["image"], c[0]["image"])


def test_train_epochs_cover_and_reshuffle():
  src = IndexSource(100)
  it = D.make_train_iterator(_index_cfg(), src, seed=0, local_batch_size=10)
  epochs = [np.concatenate([_indices(b) for b in _take(it, 10)]) for _ in range(3)]
  for e in epochs:
    np.testing.assert_array_equal(np.sort(e), np.arange(100))
  assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
  it2 = D.make_train_iterator(_index_cfg(), src, seed=0, local_batch_size=25)
  np.testing.assert_array_equal(np.concatenate([_indices(b) for b in _take(it2, 4)]), epochs[0])
  # Labels travel with their images.
  b = next(D.make_train_iterator(_index_cfg(), src, seed=1, local_batch_size=10))
  np.testing.assert_array_equal(b["label"], _indices(b) % 10)


@pytest.mark.parametrize("process_count", [2, 3])
def test_train_process_shards_disjoint_and_covering(process_count):
  n = 100
  per = n // process_count
  src = IndexSource(n)
  for epoch in range(2):
    shards = []
    for p in range(process_count):
      it = D.make_train_iterator(
        _index_cfg(),
        src,
        seed=7,
        local_batch_size=per,
        process_index=p,
        process_count=process_count,
      )
      shards.append(_indices(_take(it, epoch + 1)[-1]))
    union = np.concatenate(shards)
    assert len(set(union.tolist())) == per * process_count  # Disjoint.
    assert n - len(union) < process_count  # Covering, up to the n % P remainder.
    assert set(union.tolist()) <= set(range(n))


def test_train_augmentation_independent_of_process_count():
  # Per-example randomness depends on (seed, epoch, index) only.
  src = D.DigitsSource("train")
  cfg = _cfg(train_augment="crop_flip", crop_padding=2)
  one = next(D.make_train_iterator(cfg, src, seed=0, local_batch_size=1436))
  two = next(
    D.make_train_iterator(cfg, src, seed=0, local_batch_size=718, process_index=1, process_count=2)
  )
  # Process 1 of 2 gets the second half of every global batch of the same permutation.
  np.testing.assert_array_equal(two["image"], one["image"][718:])


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_batches_concatenate_to_the_single_process_batch(process_count):
  """Row for row, so multi-host training equals single-host training (dropout rows included)."""
  src = IndexSource(100)
  single = _take(D.make_train_iterator(_index_cfg(), src, seed=3, local_batch_size=16), 7)
  local = [
    _take(
      D.make_train_iterator(
        _index_cfg(),
        src,
        seed=3,
        local_batch_size=16 // process_count,
        process_index=p,
        process_count=process_count,
      ),
      7,
    )
    for p in range(process_count)
  ]
  for step in range(7):
    joined = np.concatenate([_indices(local[p][step]) for p in range(process_count)])
    np.testing.assert_array_equal(joined, _indices(single[step]))


def test_train_iterator_exact_resume():
  cfg = _cfg(train_augment="crop_flip", crop_padding=2)
  src = D.DigitsSource("train")
  it = D.make_train_iterator(cfg, src, seed=5, local_batch_size=100)
  _take(it, 16)  # Crosses the first epoch boundary (14 batches of 100 per 1437 examples).
  state = it.get_state()
  expected = _take(it, 5)
  fresh = D.make_train_iterator(cfg, src, seed=5, local_batch_size=100)
  fresh.set_state(state)
  _assert_batches_equal(_take(fresh, 5), expected)


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_a_resumed_iterator_continues_the_global_order_on_any_process_count(process_count):
  """The position after step s is a function of s: 2 processes that stopped at step 9 (past the
  first epoch boundary) resume as 1 or 4 processes with the same global batches."""
  src = IndexSource(100)
  uninterrupted = _take(D.make_train_iterator(_index_cfg(), src, seed=3, local_batch_size=16), 14)
  resumed = [
    _take(
      D.make_train_iterator(
        _index_cfg(),
        src,
        seed=3,
        local_batch_size=16 // process_count,
        process_index=p,
        process_count=process_count,
        start_step=9,
      ),
      5,
    )
    for p in range(process_count)
  ]
  for k in range(5):
    joined = np.concatenate([_indices(resumed[p][k]) for p in range(process_count)])
    np.testing.assert_array_equal(joined, _indices(uninterrupted[9 + k]))


def test_train_batch_size_errors():
  with pytest.raises(ValueError, match="local_batch_size"):
    D.make_train_iterator(
      _index_cfg(), IndexSource(10), seed=0, local_batch_size=6, process_count=2
    )
  with pytest.raises(ValueError, match="process_index"):
    D.make_train_iterator(
      _index_cfg(), IndexSource(10), seed=0, local_batch_size=1, process_index=2, process_count=2
    )


# ----------------------------------------------------------------------------- eval pipeline


@pytest.mark.parametrize("n", [1, 101])
@pytest.mark.parametrize("batch_size", [1, 7, 32, 200])
@pytest.mark.parametrize("process_count", [1, 2, 3])
def test_eval_covers_each_example_once(n, batch_size, process_count):
  src = IndexSource(n)
  seen, lengths = [], []
  for p in range(process_count):
    ev = D.make_eval_iterator(
      _index_cfg(), src, local_batch_size=batch_size, process_index=p, process_count=process_count
    )
    batches = list(ev)
    lengths.append(len(batches))
    assert len(batches) == len(ev) == D.num_eval_batches(n, batch_size, process_count)
    for b in batches:
      assert b["image"].shape == (batch_size, 4, 4, 3) and b["image"].dtype == np.uint8
      assert b["label"].shape == (batch_size,) and b["label"].dtype == np.int32
      assert b["mask"].shape == (batch_size,) and b["mask"].dtype == np.bool_
      idx = _indices(b)[b["mask"]]
      np.testing.assert_array_equal(b["label"][b["mask"]], idx % 10)
      seen.extend(idx.tolist())
  assert len(set(lengths)) == 1
  assert sorted(seen) == list(range(n))


def test_eval_reiterable_and_deterministic():
  cfg = _cfg(eval_crop_pct=0.875, image_size=8)
  ev = D.make_eval_iterator(cfg, D.DigitsSource("test"), local_batch_size=64)
  first, second = list(ev), list(ev)
  _assert_batches_equal(first, second)
  assert sum(int(b["mask"].sum()) for b in first) == 360


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
  ("field", "value", "expected"),
  [
    (
      "source",
      "imgfolder",
      "data.source='imgfolder' is not one of ['digits', 'image_folder', 'tfds']",
    ),
    ("on_corrupt", "ignore", "data.on_corrupt='ignore' is not one of ['error', 'skip']"),
    (
      "interpolation",
      "nearest",
      "data.interpolation='nearest' is not one of ['bicubic', 'bilinear']",
    ),
    (
      "train_augment",
      "randaug",
      "data.train_augment='randaug' is not one of ['crop_flip', 'none', 'rrc_flip']",
    ),
    ("train_fraction", 0.0, "data.train_fraction=0.0 must be a number in (0.0, 1.0]"),
    ("train_fraction", 1.5, "data.train_fraction=1.5"),
    ("image_size", 0, "data.image_size=0"),
    ("eval_crop_pct", 1.2, "data.eval_crop_pct=1.2"),
    ("rrc_scale", (0.5, 0.1), "data.rrc_scale=(0.5, 0.1)"),
    ("mean", (0.5,), "data.mean=(0.5,)"),
  ],
)
def test_config_errors_name_field_value_and_choices(field, value, expected):
  cfg = _cfg()
  cfg[field] = value
  with pytest.raises(ValueError) as e:
    D.make_source(cfg, "train")
  assert expected in str(e.value)
  with pytest.raises(ValueError, match=field):
    D.make_train_iterator(cfg, IndexSource(10), seed=0, local_batch_size=1)


def test_config_missing_root_and_num_classes():
  with pytest.raises(ValueError, match=r"data\.root=None"):
    D.make_source(_cfg(source="image_folder"), "train")
  with pytest.raises(ValueError, match=r"data\.num_classes=5"):
    D.make_source(_cfg(num_classes=5), "train")
  assert D.num_classes(_cfg(num_classes=12), D.DigitsSource()) == 12


# ----------------------------------------------------------------------------- TFDS


def test_tfds_not_prepared_fails_fast(tmp_path):
  cfg = _cfg(source="tfds", name="cifar10", data_dir=str(tmp_path))
  t0 = time.monotonic()
  with pytest.raises(D.DatasetNotPreparedError) as e:
    D.make_source(cfg, "train")
  assert time.monotonic() - t0 < 10
  msg = str(e.value)
  assert str(tmp_path / "cifar10") in msg
  assert "tfds build cifar10" in msg and "array_record" in msg and "download_and_prepare" in msg
  assert "tensorflow" not in sys.modules


def test_tfds_hints_name_the_packages_and_the_manual_files(tmp_path):
  with pytest.raises(D.DatasetNotPreparedError) as e:
    D.TfdsSource("imagenet2012", "train", str(tmp_path))
  msg = str(e.value)
  # The packages the `tfds` command line imports (tfds 4.9.10), and ImageNet's manual files.
  assert (
    "pip install tensorflow tensorflow-datasets apache-beam mlcroissant importlib_resources" in msg
  )
  assert "DATA_DIR/downloads/manual" in msg
  assert "ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar" in msg


def test_tfds_tfrecord_dataset_gets_the_conversion_hint(tmp_path):
  # A dataset prepared in TFRecord format (metadata written by tfds itself, without TensorFlow):
  # tfds says not to rebuild into the same data_dir, so locvit's hint converts it in place.
  tfds = pytest.importorskip("tensorflow_datasets")
  builder = tfds.builder("cifar10", data_dir=str(tmp_path), file_format="tfrecord")
  os.makedirs(builder.data_path)
  builder.info.write_to_directory(builder.data_path)
  with pytest.raises(ValueError) as e:
    D.TfdsSource("cifar10", "train", str(tmp_path))
  msg = str(e.value)
  assert "file format tfrecord" in msg
  where = str(tmp_path / "cifar10" / str(builder.version))
  convert = f"tfds convert_format --dataset_version_dir={where} --out_file_format=array_record"
  assert convert in msg
  assert "tfds build cifar10 --data_dir=NEW_DATA_DIR --file_format=array_record" in msg
  assert f"--data_dir={tmp_path} " not in msg  # never the same data_dir again
  assert "tensorflow" not in sys.modules


def test_tfds_unknown_name_lists_close_matches(tmp_path):
  with pytest.raises(ValueError, match=r"data.name='cifar11'.*'cifar10'"):
    D.TfdsSource("cifar11", "train", str(tmp_path))


def test_tfds_mock_data_through_pipeline(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  cfg = _cfg(
    source="tfds", name="cifar10", data_dir=str(tmp_path), image_size=32, train_augment="crop_flip"
  )
  with tfds.testing.mock_data(num_examples=24):
    src = D.make_source(cfg, "train")
    assert isinstance(src.source, D.TfdsSource) and len(src) == 24 and src.num_classes == 10
    ex = src[3]
    assert ex["image"].shape == (32, 32, 3) and ex["image"].dtype == np.uint8
    assert ex["label"].dtype == np.int32 and 0 <= int(ex["label"]) < 10
    assert src.labels.shape == (24,)
    batch = next(D.make_train_iterator(cfg, src, seed=0, local_batch_size=8))
    assert batch["image"].shape == (8, 32, 32, 3)
    masks = [b["mask"] for b in D.make_eval_iterator(cfg, src, local_batch_size=10)]
    assert int(np.concatenate(masks).sum()) == 24
  assert "tensorflow" not in sys.modules


# ----------------------------------------------------------------------------- augment ops


def _image(h=32, w=32, c=3, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


@pytest.mark.parametrize("padding", [0, 1, 4, 40])
def test_crop_with_padding_is_window_of_padded_image(padding):
  image = _image(10, 12)
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  for s in range(30):
    out = A.random_crop_with_padding(image, np.random.default_rng(s), 8, padding)
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    windows = [
      padded[t : t + 8, l : l + 8]
      for t in range(padded.shape[0] - 7)
      for l in range(padded.shape[1] - 7)  # noqa: E741
    ]
    assert any(np.array_equal(out, w) for w in windows)
    np.testing.assert_array_equal(
      out, A.random_crop_with_padding(image, np.random.default_rng(s), 8, padding)
    )


def test_horizontal_flip_exact():
  image = _image()
  np.testing.assert_array_equal(
    A.horizontal_flip(image, np.random.default_rng(0), p=1.0), image[:, ::-1]
  )
  np.testing.assert_array_equal(A.horizontal_flip(image, np.random.default_rng(0), p=0.0), image)
  rng = np.random.default_rng(0)
  flips = [not np.array_equal(A.horizontal_flip(image, rng), image) for _ in range(400)]
  assert 0.4 < np.mean(flips) < 0.6


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_random_resized_crop(interpolation):
  image = _image(40, 60)
  out = A.random_resized_crop(image, np.random.default_rng(1), 24, interpolation=interpolation)
  assert out.shape == (24, 24, 3) and out.dtype == np.uint8
  again = A.random_resized_crop(image, np.random.default_rng(1), 24, interpolation=interpolation)
  np.testing.assert_array_equal(out, again)
  # Full-area, unit-ratio crop of a square image is a plain resize.
  sq = _image(48, 48)
  full = A.random_resized_crop(
    sq, np.random.default_rng(0), 24, (1.0, 1.0), (1.0, 1.0), interpolation
  )
  np.testing.assert_array_equal(full, A.resize(sq, (24, 24), interpolation))
  gray = A.random_resized_crop(_image(20, 20, 1), np.random.default_rng(0), 8)
  assert gray.shape == (8, 8, 1)


def test_resize_center_crop():
  image = _image(40, 60)
  out = A.resize_center_crop(image, 32, crop_pct=0.875)
  assert out.shape == (32, 32, 3)
  sq = _image()
  np.testing.assert_array_equal(A.resize_center_crop(sq, 32, 1.0), sq)  # No-op at the right size.
  # crop_pct < 1 on a square image: resize to 36 then take the central 32x32.
  ref = A.resize(sq, (36, 36), "bicubic")[2:34, 2:34]
  np.testing.assert_array_equal(A.resize_center_crop(sq, 32, 32 / 36), ref)


def test_normalize():
  image = _image(4, 4, 3)
  mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 0.2)
  out = A.normalize(image[None], mean, std)
  assert out.dtype == np.float32 and out.shape == (1, 4, 4, 3)
  np.testing.assert_allclose(
    out[0], (image / 255.0 - np.array(mean)) / np.array(std), rtol=1e-5, atol=1e-5
  )
  gray = A.normalize(_image(4, 4, 1), mean, std)  # RGB stats on grayscale: channel average.
  np.testing.assert_allclose(
    gray, (_image(4, 4, 1) / 255.0 - 0.2) / np.mean(std), rtol=1e-5, atol=1e-5
  )


def test_augment_registry_extensible():
  assert {"none", "crop_flip", "rrc_flip"} <= set(D.list_recipes())

  @D.register_op("test_invert")
  def _invert(cfg):
    return lambda image, rng: 255 - image

  D.register_recipe("test_invert_recipe", ["resize", "test_invert"])
  try:
    cfg = _cfg(train_augment="test_invert_recipe")
    D.validate_data_config(cfg)
    image = D.DigitsSource()[0]["image"]
    np.testing.assert_array_equal(
      D.build_train_transform(cfg)(image, np.random.default_rng(0)), 255 - image
    )
    with pytest.raises(ValueError, match="already registered"):
      D.register_op("test_invert")(_invert)
    with pytest.raises(ValueError, match="unknown ops"):
      D.register_recipe("bad", ["no_such_op"])
  finally:
    A._OPS.pop("test_invert")
    A._RECIPES.pop("test_invert_recipe")


# ------------------------------------------------------------------------- repeated augmentation


@pytest.fixture
def rng_mark_recipe():
  """A recipe writing one draw of the example's generator into pixel (0, 0), channel 2."""

  @D.register_op("test_rng_mark")
  def _mark(cfg):
    def op(image, rng):
      image = image.copy()
      image[0, 0, 2] = rng.integers(0, 256)
      return image

    return op

  D.register_recipe("test_rng_mark", ["test_rng_mark"])
  yield "test_rng_mark"
  A._OPS.pop("test_rng_mark")
  A._RECIPES.pop("test_rng_mark")


def _marks(batch) -> np.ndarray:
  return batch["image"][:, 0, 0, 2].astype(np.int64)


def test_repeated_augmentation_epoch_order_and_copies(rng_mark_recipe):
  n, k, seed = 100, 3, 5
  cfg = _index_cfg(repeated_augmentations=k)
  cfg.train_augment = rng_mark_recipe
  it = D.make_train_iterator(cfg, IndexSource(n), seed=seed, local_batch_size=10)
  for epoch in range(2):
    batches = _take(it, 10)  # Epoch length stays n = 100 examples.
    seq = np.concatenate([_indices(b) for b in batches])
    perm = np.random.default_rng([0, seed, epoch]).permutation(n)
    np.testing.assert_array_equal(seq, np.repeat(perm[:34], k)[:n])  # ceil(100 / 3) = 34.
    counts = np.bincount(seq, minlength=n)
    assert sorted(set(counts.tolist())) == [0, 1, 3] and (counts == 3).sum() == 33
    # Copy c of example i draws from default_rng([1, seed, epoch, i, c]).
    marks = np.concatenate([_marks(b) for b in batches])
    expected = [
      np.random.default_rng([1, seed, epoch, int(i), j % k]).integers(0, 256)
      for j, i in enumerate(seq)
    ]
    np.testing.assert_array_equal(marks, expected)
    triples = marks[:99].reshape(33, 3)
    assert (triples[:, 0] == triples[:, 1]).sum() + (triples[:, 1] == triples[:, 2]).sum() < 4
    for b in batches:
      np.testing.assert_array_equal(b["label"], _indices(b) % 10)


def test_single_augmentation_stream_unchanged(rng_mark_recipe):
  cfg = _index_cfg()
  cfg.train_augment = rng_mark_recipe
  b = next(D.make_train_iterator(cfg, IndexSource(50), seed=2, local_batch_size=25))
  expected = [np.random.default_rng([1, 2, 0, int(i)]).integers(0, 256) for i in _indices(b)]
  np.testing.assert_array_equal(_marks(b), expected)


@pytest.mark.parametrize("process_count", [2, 4])
def test_repeated_augmentation_process_split_equals_single_process(rng_mark_recipe, process_count):
  cfg = _index_cfg(repeated_augmentations=3)
  cfg.train_augment = rng_mark_recipe
  src = IndexSource(100)
  single = _take(D.make_train_iterator(cfg, src, seed=3, local_batch_size=16), 8)
  local = [
    _take(
      D.make_train_iterator(
        cfg,
        src,
        seed=3,
        local_batch_size=16 // process_count,
        process_index=p,
        process_count=process_count,
      ),
      8,
    )
    for p in range(process_count)
  ]
  for step in range(8):  # Crosses the epoch boundary (6 global batches of 16 per epoch).
    for key in ("image", "label"):
      joined = np.concatenate([local[p][step][key] for p in range(process_count)])
      np.testing.assert_array_equal(joined, single[step][key])


def test_repeated_augmentation_resume_and_validation():
  cfg = _cfg(train_augment="crop_flip", crop_padding=2, repeated_augmentations=3)
  src = D.DigitsSource("train")
  it = D.make_train_iterator(cfg, src, seed=1, local_batch_size=100)
  _take(it, 15)
  state = it.get_state()
  expected = _take(it, 2)
  fresh = D.make_train_iterator(cfg, src, seed=1, local_batch_size=100)
  fresh.set_state(state)
  _assert_batches_equal(_take(fresh, 2), expected)
  for bad in (0, -2):
    with pytest.raises(
      ValueError, match=rf"data\.repeated_augmentations={bad!r} must be an integer"
    ):
      D.validate_data_config(_cfg(repeated_augmentations=bad))


# ----------------------------------------------------------------------------- class limit


def test_class_limit_digits_all_splits():
  full_train, full_test = D.DigitsSource("train"), D.DigitsSource("test")
  cfg = _cfg(class_limit=3)
  for split, full in (("train", full_train), ("test", full_test)):
    src = D.make_source(cfg, split)
    keep = np.flatnonzero(full.labels < 3)
    assert len(src) == len(keep) and src.num_classes == 3 and D.num_classes(cfg, src) == 3
    assert src.class_names == ["0", "1", "2"]
    np.testing.assert_array_equal(src.labels, full.labels[keep])
    np.testing.assert_array_equal(src[5]["image"], full[keep[5]]["image"])
  # train_fraction applies per class on the limited source.
  half = D.make_source(_cfg(class_limit=3, train_fraction=0.5), "train")
  counts = np.bincount(full_train.labels)[:3]
  np.testing.assert_array_equal(np.bincount(half.labels), [int(c * 0.5) for c in counts])
  assert half.num_classes == 3
  # Eval covers exactly the limited examples.
  ev = D.make_eval_iterator(cfg, D.make_source(cfg, "test"), local_batch_size=32)
  labels = np.concatenate([b["label"][b["mask"]] for b in ev])
  np.testing.assert_array_equal(np.sort(labels), np.sort(full_test.labels[full_test.labels < 3]))
  assert len(D.make_source(_cfg(class_limit=10), "train")) == len(full_train)


def test_class_limit_errors():
  with pytest.raises(
    ValueError,
    match=r"data\.class_limit=11 must be in \[1, 10\]: it exceeds the 10 classes of DigitsSource",
  ):
    D.make_source(_cfg(class_limit=11), "train")
  with pytest.raises(ValueError, match=r"data\.class_limit=0 must be an integer in \[1, "):
    D.make_source(_cfg(class_limit=0), "train")
  with pytest.raises(ValueError, match=r"data\.num_classes=2 is smaller than the 3 classes") as e:
    D.make_source(_cfg(class_limit=3, num_classes=2), "train")
  assert str(e.value).endswith(": a label past the head has no output; "
                               "--config.data.num_classes=3 fits the head to them")  # fmt: skip


def test_class_limit_image_folder(cifar10_folder):
  cfg = _cfg(source="image_folder", root=str(cifar10_folder), image_size=32, class_limit=2)
  train, test = D.make_source(cfg, "train"), D.make_source(cfg, "test")
  assert (len(train), len(test)) == (10_000, 2_000)
  assert train.class_names == ["airplane", "automobile"] and train.num_classes == 2
  subset = train.source  # the decoded-once cache holds the class-limited subset
  assert Path(subset.source.paths[int(subset.indices[-1])]).parent.name == "automobile"


def test_16_bit_images_are_scaled_to_8_bits(tmp_path):
  """A 16-bit greyscale PNG trains as its grey levels (was: clipped to white by convert('RGB'))."""
  folder = tmp_path / "train" / "grey"
  folder.mkdir(parents=True)
  levels = np.array([[0, 257, 32768, 65535]], np.uint16)
  Image.fromarray(levels).save(folder / "a.png")
  source = D.ImageFolderSource(tmp_path, "train")
  pixels = source.decode(0)
  assert pixels.dtype == np.uint8 and pixels.shape == (1, 4, 3)
  np.testing.assert_array_equal(pixels[..., 0], [[0, 1, 128, 255]])
  assert (pixels == pixels[..., :1]).all()
