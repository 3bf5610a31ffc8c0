"""Prepares CIFAR-10 / CIFAR-100 as the image folders the configs read, from the official archives.

  python -m locvit.data.prepare cifar10 --out=DIR                       # downloads the archive
  python -m locvit.data.prepare cifar10 --out=DIR --archive=cifar-10-python.tar.gz   # offline
  export CIFAR10_ROOT=DIR

The archive (``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz`` from
https://www.cs.toronto.edu/~kriz/cifar.html) is checked against the MD5 published there before it
is read. The output is ``DIR/{train,test}/<class>/<NNNNN>.<ext>``, the images of each class in the
archive's order (so ``data.train_fraction`` keeps the first images of each class), CIFAR-100 by
its 100 fine labels. ``--format=png`` (the default) writes the archive's pixels losslessly, the
images every paper's code trained and tested on; ``--format=jpeg`` writes JPEG at ``--quality``
(default 75), the smaller, lossy copy the reduced-scale numbers of docs/results.md were measured
on (a paper-protocol plan refuses it unless told ``--allow_lossy_data``).
The splits are written into ``DIR/.partial`` and moved into place when complete, so an interrupted
run leaves no half-written split behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import pickle
import shutil
import sys
import tarfile
import urllib.request

import numpy as np
from etils import epath
from PIL import Image

from locvit.choices import ArgumentParser


@dataclasses.dataclass(frozen=True)
class Archive:
  """One official CIFAR archive in its Python (pickle) format."""

  filename: str
  md5: str  # published on https://www.cs.toronto.edu/~kriz/cifar.html
  folder: str  # the folder inside the tarball
  splits: dict[str, tuple[str, ...]]  # split -> pickled batch files
  meta: str  # the pickle holding the class names
  names_key: str  # its key for the class names
  labels_key: str  # a batch's key for the labels

  @property
  def url(self) -> str:
    """Where the archive is published."""
    return f"https://www.cs.toronto.edu/~kriz/{self.filename}"


ARCHIVES = {
  "cifar10": Archive(
    filename="cifar-10-python.tar.gz",
    md5="c58f30108f718f92721af3b95e74349a",
    folder="cifar-10-batches-py",
    splits={"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
    meta="batches.meta",
    names_key="label_names",
    labels_key="labels",
  ),
  "cifar100": Archive(
    filename="cifar-100-python.tar.gz",
    md5="eb9058c3a382ffc7106e4002c42a8d85",
    folder="cifar-100-python",
    splits={"train": ("train",), "test": ("test",)},
    meta="meta",
    names_key="fine_label_names",
    labels_key="fine_labels",
  ),
}
# What to run next, as the README says it: every config of the dataset reads $..._ROOT.
USE_HINT = {
  "cifar10": "export CIFAR10_ROOT={out}  (or --data=image_folder:{out} on any config)",
  "cifar100": "export CIFAR100_ROOT={out}  (or --data=image_folder:{out} on any config)",
}
FORMATS = {"png": "png", "jpeg": "jpg"}  # --format -> file extension
JPEG_QUALITY = 75  # the JPEG copy docs/results.md's reduced-scale numbers were measured on


class PrepareError(ValueError):
  """A problem with the archive or the output directory, reported as one line."""


def md5sum(path: epath.Path) -> str:
  """The hex MD5 of the file at ``path`` (the checksum the CIFAR page publishes)."""
  digest = hashlib.md5()
  with path.open("rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def download(archive: Archive, directory: epath.Path) -> epath.Path:
  """Downloads ``archive`` into ``directory`` (kept there for the next run)."""
  target = directory / archive.filename
  if target.exists():
    return target
  partial = directory / (archive.filename + ".download")
  print(f"downloading {archive.url}", flush=True)
  try:
    with urllib.request.urlopen(archive.url) as response, partial.open("wb") as f:
      shutil.copyfileobj(response, f)
  except OSError as e:
    raise PrepareError(
      f"cannot download {archive.url} ({e}); download it elsewhere and pass --archive=FILE"
    ) from e
  partial.rename(target)
  return target


def _unpickle(tar: tarfile.TarFile, archive: Archive, member: str) -> dict:
  name = f"{archive.folder}/{member}"
  try:
    f = tar.extractfile(name)
  except KeyError:
    raise PrepareError(f"{archive.filename} has no {name}: not the official archive") from None
  return pickle.load(f, encoding="bytes")


def convert(
  dataset: str,
  archive_path: epath.Path,
  out: epath.Path,
  image_format: str = "png",
  quality: int = JPEG_QUALITY,
) -> dict:
  """Writes ``out/{train,test}/<class>/*`` from a checked archive (JPEG at ``quality``); returns
  images per split."""
  archive = ARCHIVES[dataset]
  found = md5sum(archive_path)
  if found != archive.md5:
    raise PrepareError(
      f"{archive_path}: MD5 {found} is not the published {archive.md5} of {archive.filename} "
      "(damaged or a different file)"
    )
  existing = [split for split in archive.splits if (out / split).exists()]
  if existing:
    raise PrepareError(f"{out / existing[0]} already exists; choose an empty --out")
  extension = FORMATS[image_format]
  options = {"quality": quality} if image_format == "jpeg" else {}
  partial = out / ".partial"
  if partial.exists():
    partial.rmtree()  # left by an interrupted run
  counts = {}
  with tarfile.open(archive_path, "r:gz") as tar:
    names = [n.decode() for n in _unpickle(tar, archive, archive.meta)[archive.names_key.encode()]]
    for split, members in archive.splits.items():
      written = [0] * len(names)
      for name in names:
        (partial / split / name).mkdir(parents=True, exist_ok=True)
      for member in members:
        batch = _unpickle(tar, archive, member)
        images = np.asarray(batch[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        for image, label in zip(images, batch[archive.labels_key.encode()], strict=True):
          buffer = io.BytesIO()
          Image.fromarray(image).save(buffer, format=image_format.upper(), **options)
          index = written[label]
          (partial / split / names[label] / f"{index:05d}.{extension}").write_bytes(
            buffer.getvalue()
          )
          written[label] += 1
      counts[split] = sum(written)
  for split in archive.splits:
    (partial / split).rename(out / split)
  partial.rmdir()
  return counts


def parser() -> ArgumentParser:
  """The command line of ``python -m locvit.data.prepare``."""
  parser = ArgumentParser(
    prog="python -m locvit.data.prepare",
    description="Prepare CIFAR-10/100 image folders (DIR/{train,test}/<class>/) from the official "
    "archive, checked against its published MD5.",
  )
  parser.add_argument("dataset", choices=sorted(ARCHIVES))
  parser.add_argument("--out", required=True, help="output directory (the config's data.root)")
  parser.add_argument(
    "--archive", help="a local copy of the official archive (default: download it into --out)"
  )
  parser.add_argument(
    "--format",
    choices=sorted(FORMATS),
    default="png",
    help="png: the archive's pixels, lossless (default; what the papers trained on); jpeg: lossy, "
    "at --quality",
  )
  parser.add_argument(
    "--quality",
    type=int,
    default=None,
    help=f"with --format=jpeg: the JPEG quality, 1-95 (default {JPEG_QUALITY}, the copy "
    "docs/results.md's reduced-scale numbers were measured on)",
  )
  return parser


def jpeg_quality(image_format: str, quality: int | None) -> int:
  """``--quality``, checked: for ``--format=jpeg`` only, 1-95 (PIL's useful range)."""
  if quality is None:
    return JPEG_QUALITY
  if image_format != "jpeg":
    raise PrepareError(
      f"--quality={quality} is for --format=jpeg; --format={image_format} is lossless"
    )
  if not 1 <= quality <= 95:
    raise PrepareError(f"--quality={quality}: must be 1-95")
  return quality


def main(argv: list[str] | None = None) -> int:
  """Prepares the dataset; 0 on success, 2 (with one line on stderr) on a bad archive or output."""
  args = parser().parse_args(argv)
  out = epath.Path(args.out)
  try:
    quality = jpeg_quality(args.format, args.quality)
    out.mkdir(parents=True, exist_ok=True)
    archive = ARCHIVES[args.dataset]
    if args.archive:
      archive_path = epath.Path(args.archive)
      if not archive_path.exists():
        raise PrepareError(f"--archive={args.archive}: no such file")
    else:
      archive_path = download(archive, out)
    counts = convert(args.dataset, archive_path, out, args.format, quality)
  except (PrepareError, OSError) as e:
    print(f"locvit.data.prepare: error: {e}", file=sys.stderr)
    return 2
  split_counts = ", ".join(f"{split} {n}" for split, n in counts.items())
  written = "png" if args.format == "png" else f"jpeg (quality {quality}, lossy)"
  print(f"{args.dataset}: {split_counts} images as {written} in {out}", flush=True)
  print(f"use it with: {USE_HINT[args.dataset].format(out=out)}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
