"""Li & Zhang Table 1: five ViTs with and without the Gaussian mixture mask on four datasets.

  python -m locvit.main --config=configs/gmm_table1.py:ARCH,DATASET,VARIANT --workdir=DIR
  e.g. --config=configs/gmm_table1.py:swin,cifar100,gmm

ARCH in vit | swin | cait | pit | t2t; DATASET in cifar10 | cifar100 | svhn | tinyimagenet;
VARIANT in base | gmm (default ``vit,cifar10,gmm``). GMM: K = 5 kernels per head, the faithful
kernel, multiplied into the scaled logits. Paper top-1 (%):

| model    | CIFAR-10 | CIFAR-100 | SVHN  | Tiny-ImageNet | params | depth |
|----------|----------|-----------|-------|---------------|--------|-------|
| ViT      | 93.65    | 75.36     | 97.93 | 59.89         | 2.7M   | 9     |
| GMM-ViT  | 95.06    | 77.81     | 98.01 | 62.27         | 2.7M   | 9     |
| Swin     | 95.26    | 77.88     | 97.89 | 60.45         | 7.1M   | 12    |
| GMM-Swin | 95.39    | 78.26     | 97.90 | 61.03         | 7.1M   | 12    |
| CaiT     | 94.79    | 78.42     | 98.13 | 62.46         | 5.1M   | 26    |
| GMM-CaiT | 95.15    | 78.97     | 98.09 | 63.64         | 5.1M   | 26    |
| PiT      | 93.68    | 72.82     | 97.78 | 57.63         | 7.0M   | 12    |
| GMM-PiT  | 94.41    | 74.16     | 97.82 | 58.37         | 7.0M   | 12    |
| T2T      | 95.32    | 78.10     | 97.99 | 61.50         | 6.5M   | 13    |
| GMM-T2T  | 96.16    | 79.91     | 97.98 | 63.33         | 6.5M   | 13    |

Models (32x32 / 64x64): ViT patch 4 / 8 (dim 192, depth 9, class token for the baseline, mean
pooling with GMM); Swin patch 2 / 4; CaiT patch 4 / 8; PiT patch 2 / 4; T2T with 1 / 2 token
transformers. Notes on the paper's numbers: Table 1's ViT accuracies (93.65 / 95.06 on CIFAR-10)
are Table 3's depth-15 row (Table 2 calls that model 2.5M, +150 parameters), while Table 1 states
depth 9 and 2.7M -- this config follows the stated depth 9 (the official ``create_model('vit')``);
``gmm_table3.py:d15,...`` gives the depth-15 model, and the paper-protocol plan
``gmm_table1_cifar10`` (``python -m locvit.reproduce``) trains both depths against Table 3's
numbers. The CaiT built here (the official
``CaiT`` defaults) has 9.0M parameters, Table 4's count, not Table 1's 5.1M.

Recipe: the ``small_vit`` preset, see ``configs/gmm_common.py``.
"""

from __future__ import annotations

import ml_collections

from locvit.configs.args import Field, parse
from locvit.configs.gmm_common import DATASETS, gmm_config, smallvit_name

DATASET_ORDER = ("cifar10", "cifar100", "svhn", "tinyimagenet")
# arch -> (baseline top-1 per dataset, GMM top-1 per dataset), percent.
PAPER = {
  "vit": ((93.65, 75.36, 97.93, 59.89), (95.06, 77.81, 98.01, 62.27)),
  "swin": ((95.26, 77.88, 97.89, 60.45), (95.39, 78.26, 97.90, 61.03)),
  "cait": ((94.79, 78.42, 98.13, 62.46), (95.15, 78.97, 98.09, 63.64)),
  "pit": ((93.68, 72.82, 97.78, 57.63), (94.41, 74.16, 97.82, 58.37)),
  "t2t": ((95.32, 78.10, 97.99, 61.50), (96.16, 79.91, 97.98, 63.33)),
}
PARAMS = {"vit": "2.7M", "swin": "7.1M", "cait": "5.1M", "pit": "7.0M", "t2t": "6.5M"}
VARIANTS = ("base", "gmm")
ARGS = {
  "arch": Field("vit", PAPER, "architecture"),
  "dataset": Field("cifar10", DATASET_ORDER),
  "variant": Field("gmm", VARIANTS),
}


def model_name(arch: str, dataset: str, variant: str) -> str:
  mask = "gmm" if variant == "gmm" else None
  if arch == "vit":
    return smallvit_name("d9", dataset, mask)
  prefix = "gmm_" if mask else ""
  small = DATASETS[dataset]["image_size"] == 32
  suffix = {
    "swin": "patch2_32" if small else "patch4_64",
    "cait": "patch4_32" if small else "patch8_64",
    "pit": "patch2_32" if small else "patch4_64",
    "t2t": "32" if small else "64",
  }[arch]
  return f"{prefix}{arch}_smalldata_{suffix}"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arch, dataset, variant = parse(__file__, arg, ARGS).values()
  top1 = PAPER[arch][VARIANTS.index(variant)][DATASET_ORDER.index(dataset)]
  row = f"{'GMM-' if variant == 'gmm' else ''}{arch}"
  return gmm_config(
    model_name(arch, dataset, variant),
    dataset,
    table="1",
    row=row,
    top1=round(top1 / 100, 4),
    params=PARAMS[arch],
  )
