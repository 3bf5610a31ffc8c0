"""Attention maps at initialization of the reduced structured-init model (Zheng, Li, Lucey, Fig. 3)
for its three inits, averaged over real CIFAR-10 images.

  python experiments/structinit_init_maps.py --image_folder=$CIFAR10_ROOT \\
    [--config=configs/structinit_cifar10_small.py] [--out=DIR (default: init_maps)]

Uses ``locvit.analysis.init_maps.compare_inits`` with the model, overrides and ``config.init`` of
each variant (seed 0), on the images resized and centre-cropped as for evaluation
(``data.image_size``), and writes ``<out>/<init>.png`` and ``<out>/comparison.png`` (layers 0, 4
and 7, head 0 in the comparison; the zoom shows the first 16 queries and keys, two rows of the
8x8 token grid).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from run_utils import load_config, run

from locvit.analysis.init_maps import compare_inits, load_images
from locvit.data import ImageFolderSource, build_eval_transform


def main(argv: Sequence[str] | None = None) -> None:
  """Writes the init-map figures and prints their paths."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/structinit_cifar10_small.py")
  parser.add_argument("--image_folder", required=True, help="ROOT/train/<class>/*.jpg")
  parser.add_argument("--num_images", type=int, default=256)
  parser.add_argument("--layers", default="0,4,7")
  parser.add_argument("--zoom", type=int, default=16)
  parser.add_argument("--out", default="init_maps", help="a folder (the docs': by name)")
  args = parser.parse_args(argv)

  names = ("trunc_normal", "mimetic", "impulse3")
  configs = {name: load_config(f"{args.config}:{name}") for name in names}
  first = configs["impulse3"]
  images = load_images(
    ImageFolderSource(args.image_folder, first.data.train_split),
    args.num_images,
    first.data.mean,
    first.data.std,
    build_eval_transform(first.data),  # a folder of 40x48 images: the model's 8x8 grid
  )
  paths = compare_inits(
    first.model.name,
    {name: c.init for name, c in configs.items()},
    images,
    args.out,
    layers=[int(i) for i in args.layers.split(",")],
    zoom=args.zoom,
    seed=first.seed,
    **first.model.overrides.to_dict(),
  )
  for path in paths:
    print(path)


if __name__ == "__main__":
  run(main)
