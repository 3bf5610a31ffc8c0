"""``python -m locvit.data.prepare``: official-format archives built here (pickled batches in a
.tar.gz, as on https://www.cs.toronto.edu/~kriz/cifar.html, a few images each), offline."""

import io
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

from locvit.data import prepare
from locvit.data.sources import ImageFolderSource


def official_archive(path, dataset, images_per_batch=6):
  """A tarball laid out like the official one: ``(archive, {split: (images NHWC, labels)})``."""
  archive = prepare.ARCHIVES[dataset]
  names = [f"class{i}" for i in range(3)]
  rng = np.random.default_rng(0)
  content, members = {}, {archive.meta: {archive.names_key.encode(): [n.encode() for n in names]}}
  for split, batches in archive.splits.items():
    images, labels = [], []
    for batch in batches:
      pixels = rng.integers(0, 256, (images_per_batch, 3, 32, 32), dtype=np.uint8)
      batch_labels = [i % len(names) for i in range(images_per_batch)]
      members[batch] = {
        b"data": pixels.reshape(images_per_batch, -1),
        archive.labels_key.encode(): batch_labels,
      }
      images.append(pixels.transpose(0, 2, 3, 1))
      labels += batch_labels
    content[split] = (np.concatenate(images), labels)
  with tarfile.open(path, "w:gz") as tar:
    for member, value in members.items():
      data = pickle.dumps(value)
      info = tarfile.TarInfo(f"{archive.folder}/{member}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return archive, content


@pytest.fixture
def with_checksum_of(monkeypatch):
  """Publishes the test archive's MD5 as the official one (the real archives are not here)."""

  def publish(dataset, path):
    monkeypatch.setitem(
      prepare.ARCHIVES,
      dataset,
      prepare.dataclasses.replace(prepare.ARCHIVES[dataset], md5=prepare.md5sum(path)),
    )

  return publish


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_png_folders_hold_the_archive_pixels_in_order(tmp_path, capsys, dataset, with_checksum_of):
  path = tmp_path / "archive.tar.gz"
  _, content = official_archive(path, dataset)
  with_checksum_of(dataset, path)
  out = tmp_path / "data"
  argv = [dataset, f"--out={out}", f"--archive={path}", "--format=png"]
  assert prepare.main(argv) == 0
  images, labels = content["train"]
  first_of_class1 = images[labels.index(1)]
  written = np.asarray(Image.open(out / "train/class1/00000.png"))
  np.testing.assert_array_equal(written, first_of_class1)
  source = ImageFolderSource(out, "test")  # the layout the configs read
  assert len(source) == len(content["test"][1])
  assert source.class_names == ["class0", "class1", "class2"]
  assert not (out / ".partial").exists()
  lines = capsys.readouterr().out.splitlines()
  counts = f"train {len(labels)}, test {len(content['test'][1])}"
  assert lines[0] == f"{dataset}: {counts} images as png in {out}"
  variable = {"cifar10": "CIFAR10_ROOT", "cifar100": "CIFAR100_ROOT"}[dataset]  # as the README
  assert lines[1] == (
    f"use it with: export {variable}={out}  (or --data=image_folder:{out} on any config)"
  )


def test_lossless_png_by_default(tmp_path, with_checksum_of):
  path = tmp_path / "cifar-10-python.tar.gz"
  _, content = official_archive(path, "cifar10")
  with_checksum_of("cifar10", path)
  assert prepare.main(["cifar10", f"--out={tmp_path}/d", f"--archive={path}"]) == 0
  written = np.asarray(Image.open(tmp_path / "d/train/class0/00000.png"))
  np.testing.assert_array_equal(written, content["train"][0][0])
  assert not list((tmp_path / "d").rglob("*.jpg"))


@pytest.mark.parametrize("quality", [None, 90])
def test_jpeg_on_request_at_its_quality(tmp_path, capsys, with_checksum_of, quality):
  path = tmp_path / "cifar-10-python.tar.gz"
  _, content = official_archive(path, "cifar10")
  with_checksum_of("cifar10", path)
  argv = ["cifar10", f"--out={tmp_path}/d", f"--archive={path}", "--format=jpeg"]
  assert prepare.main(argv + ([f"--quality={quality}"] if quality else [])) == 0
  written = np.asarray(Image.open(tmp_path / "d/train/class0/00000.jpg"), np.float32)
  buffer = io.BytesIO()
  Image.fromarray(content["train"][0][0]).save(buffer, format="JPEG", quality=quality or 75)
  np.testing.assert_array_equal(written, np.asarray(Image.open(buffer), np.float32))
  assert f"images as jpeg (quality {quality or 75}, lossy) in " in capsys.readouterr().out


def test_quality_without_jpeg_is_refused_and_writes_nothing(tmp_path, capsys):
  argv = ["cifar10", f"--out={tmp_path}/d", "--archive=a.tar.gz", "--quality=90"]
  assert prepare.main(argv) == 2
  assert capsys.readouterr().err == (
    "locvit.data.prepare: error: --quality=90 is for --format=jpeg; --format=png is lossless\n"
  )
  assert prepare.main([*argv[:3], "--format=jpeg", "--quality=0"]) == 2
  assert capsys.readouterr().err == "locvit.data.prepare: error: --quality=0: must be 1-95\n"
  assert not (tmp_path / "d").exists()


def test_wrong_checksum_is_refused_and_writes_nothing(tmp_path, capsys):
  path = tmp_path / "cifar-10-python.tar.gz"
  official_archive(path, "cifar10")
  assert prepare.main(["cifar10", f"--out={tmp_path}/d", f"--archive={path}"]) == 2
  err = capsys.readouterr().err
  assert err == (
    f"locvit.data.prepare: error: {path}: MD5 {prepare.md5sum(path)} is not the published "
    "c58f30108f718f92721af3b95e74349a of cifar-10-python.tar.gz (damaged or a different file)\n"
  )
  assert list((tmp_path / "d").iterdir()) == []


def test_prepared_folder_is_not_overwritten(tmp_path, capsys, with_checksum_of):
  path = tmp_path / "a.tar.gz"
  official_archive(path, "cifar10")
  with_checksum_of("cifar10", path)
  (tmp_path / "d/train").mkdir(parents=True)
  assert prepare.main(["cifar10", f"--out={tmp_path}/d", f"--archive={path}"]) == 2
  assert "d/train already exists; choose an empty --out" in capsys.readouterr().err
