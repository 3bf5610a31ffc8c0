"""Li & Zhang Fig. 6: GMM-ViT top-1 against the number of Gaussian kernels K = 1..10.

  python -m locvit.main --config=configs/gmm_fig6.py:DATASET,K --workdir=DIR

DATASET in cifar100 | tinyimagenet, K in 0..10 (0: the ViT without GMM, Fig. 6's reference
line). Default ``cifar100,5``. The model is Table 1's ViT (depth 9, dim 192; patch 4 on CIFAR-100,
8 on Tiny-ImageNet) with K kernels per head in every layer (2 K H parameters per layer).

The paper gives Fig. 6 only as a plot (accuracy rises quickly from K = 1 and saturates near
K = 5); its text prints no values, so ``c.paper.top1`` is None here.

Recipe: the ``small_vit`` preset, see ``configs/gmm_common.py``.
"""

from __future__ import annotations

import ml_collections

from locvit.configs.args import Field, parse
from locvit.configs.gmm_common import gmm_config, smallvit_name

MAX_KERNELS = 10
ARGS = {
  "dataset": Field("cifar100", ("cifar100", "tinyimagenet")),
  "kernels": Field(5, range(MAX_KERNELS + 1), "number of kernels"),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  dataset, k = parse(__file__, arg, ARGS).values()
  c = gmm_config(
    smallvit_name("d9", dataset, "gmm" if k else None),
    dataset,
    table="Fig. 6",
    row=f"GMM-ViT K={k}" if k else "ViT",
    top1=None,
  )
  if k:
    c.model.overrides.attention_kwargs = {
      "gmm": {"num_kernels": k, "kernel": "faithful", "combine": "multiply"}
    }
  return c
