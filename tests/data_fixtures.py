"""Shared data fixtures. Import into a test module (or conftest) to use them."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# The project's shared/ folder sits beside the checkout (as in CI); override with an env var.
CIFAR10_TARBALL = Path(
  os.environ.get(
    "LOCVIT_CIFAR10_TARBALL",
    Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpeg.tar.gz",
  )
)


@pytest.fixture(scope="session")
def cifar10_folder(tmp_path_factory) -> Path:
  """The CIFAR-10 JPEG image folder (ROOT/{train,test}/<class>/*.jpg), extracted once a session."""
  if not CIFAR10_TARBALL.exists():
    if os.environ.get("CI"):  # CI always has shared/: a missing copy is a failure, not a skip
      pytest.fail(f"{CIFAR10_TARBALL} not found (set LOCVIT_CIFAR10_TARBALL)")
    pytest.skip(f"{CIFAR10_TARBALL} not available")
  root = tmp_path_factory.mktemp("cifar10_jpeg")
  subprocess.run(["tar", "-xzf", str(CIFAR10_TARBALL), "-C", str(root)], check=True)
  return root


def copy_classes(src_root: Path, dst_root: Path, classes: list[str], n: int = 5) -> Path:
  """Copies the first `n` files of each class of both splits into a new image folder."""
  for split in ("train", "test"):
    for c in classes:
      (dst_root / split / c).mkdir(parents=True)
      for f in sorted((src_root / split / c).iterdir())[:n]:
        shutil.copy(f, dst_root / split / c / f.name)
  return dst_root
