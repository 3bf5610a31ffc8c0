"""Downloads the wheels locvit needs on a GPU machine that has no network (see README, "GPU kit").

  python benchmarks/gpu_wheels.py [--dest=gpu_wheels]

The target machine runs Python 3.12 on manylinux x86-64 and already has jax, flax, optax,
orbax-checkpoint, chex, etils, torch, timm, numpy, pillow and the rest of ``ON_GPU_IMAGE``. The
packages below are what locvit imports there beyond that image; each is fetched without its
dependencies (``pip download --no-deps --only-binary=:all:``), and then every wheel's own
requirements are checked against the downloaded wheels and the image, so a missing one is named
here rather than failing there. ``--dest`` is git-ignored: the wheels travel with the checkout but
are never committed. tensorflow-datasets is left out: locvit imports it only for TFDS sources.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

WHEELS = (
  "ml-collections==1.1.0",  # every config
  "grain==0.2.18",  # the input pipeline and its checkpointed position
  "array-record==0.8.6",  # grain
  "portpicker==1.6.0",  # grain
  "dm-pix==0.4.5",  # augmentation on the device
  "tensorboardX==2.6.5",  # TensorBoard files
  "etils==1.15.0",  # etils.epath at the version locvit is tested with
)
# Python packages of the GPU image that locvit's wheels may require (normalised names).
ON_GPU_IMAGE = frozenset(
  (
    "absl-py",
    "attrs",
    "chex",
    "cloudpickle",
    "etils",
    "flax",
    "fsspec",
    "jax",
    "jaxlib",
    "matplotlib",
    "ml-dtypes",
    "msgpack",
    "numpy",
    "optax",
    "orbax-checkpoint",
    "packaging",
    "pillow",
    "protobuf",
    "psutil",
    "pyyaml",
    "scikit-learn",
    "tensorstore",
    "timm",
    "toolz",
    "torch",
    "typing-extensions",
    "wrapt",
    "zipp",
  )
)
PLATFORMS = (
  "manylinux_2_28_x86_64",
  "manylinux_2_27_x86_64",
  "manylinux_2_17_x86_64",
  "manylinux2014_x86_64",
  "manylinux1_x86_64",
)


def normalise(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: Path) -> list[str]:
  """Names of the wheel's unconditional requirements (``Requires-Dist`` lines without extras)."""
  with zipfile.ZipFile(wheel) as archive:
    metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    lines = archive.read(metadata).decode().splitlines()
  names = []
  for line in lines:
    if line.startswith("Requires-Dist:") and "extra ==" not in line:
      requirement = line.split(":", 1)[1].split(";")[0].strip()
      names.append(normalise(re.split(r"[\s\[<>=!~(]", requirement, maxsplit=1)[0]))
  return names


def missing(wheels: list[Path]) -> dict[str, list[str]]:
  """``{wheel file: requirements neither downloaded nor on the GPU image}``."""
  have = {normalise(w.name.split("-")[0]) for w in wheels} | ON_GPU_IMAGE
  gaps = {w.name: [r for r in requirements(w) if r not in have] for w in wheels}
  return {name: names for name, names in gaps.items() if names}


def download(dest: Path) -> list[Path]:
  platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
  subprocess.run(
    [
      *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
      *("--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest)),
      *WHEELS,
    ],
    check=True,
  )
  wanted = {normalise(spec.split("==")[0]) for spec in WHEELS}
  return sorted(w for w in dest.glob("*.whl") if normalise(w.name.split("-")[0]) in wanted)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dest", default="gpu_wheels", help="folder for the wheels (git-ignored)")
  args = parser.parse_args()
  dest = Path(args.dest)
  dest.mkdir(parents=True, exist_ok=True)
  wheels = download(dest)
  size = sum(w.stat().st_size for w in wheels) / 2**20
  print(f"{len(wheels)} wheels, {size:.1f} MiB, in {dest}/")
  gaps = missing(wheels)
  for name, names in gaps.items():
    print(f"{name} requires {', '.join(names)}: neither downloaded nor on the GPU image")
  sys.exit(1 if gaps else 0)


if __name__ == "__main__":
  main()
