"""Table 2 of Zheng, Li, Lucey: ViT-T with each initialization on CIFAR-10/100, SVHN, ImageNet-1K.

    --config=configs/structinit_datasets.py:DATASET,INIT

DATASET in {cifar10, cifar100, svhn, imagenet}; INIT in {trunc_normal, kaiming_uniform, mimetic,
impulse3, impulse5}. Models: ViT-T/h3 at patch 2 on 32x32 (``structvit_tiny_patch2_32``), or at
patch 16 on 224x224 for ImageNet (``structvit_tiny_patch16_224``). Paper, CIFAR-10: Kaiming 86.36,
trunc-normal 88.63, mimetic 91.16, Imp.-3 91.62, Imp.-5 90.67.

Recipe: ``structinit_common`` (small-dataset or ImageNet recipe, see there).
The impulse solve uses the defaults: 'same' Q/K for all layers, PE pseudo input, 10,000 Adam steps.
"""

from locvit.configs.args import Field, parse
from locvit.configs.structinit_common import (
  INITS,
  imagenet_config,
  small_data_config,
)

ARGS = {
  "dataset": Field("cifar10", ("cifar10", "cifar100", "svhn", "imagenet")),
  "init": Field("impulse3", INITS),
}


def get_config(arg: str | None = None):
  dataset, init = parse(__file__, arg, ARGS).values()
  if dataset == "imagenet":
    return imagenet_config("structvit_tiny_patch16_224", init)
  return small_data_config(dataset, "structvit_tiny_patch2_32", init)
