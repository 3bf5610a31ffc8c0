"""Li & Zhang Table 4: a 30-layer GMM-ViT against CaiT at the same depth and size, CIFAR-10.

  python -m locvit.main --config=configs/gmm_table4.py:ROW --workdir=DIR

| ROW             | model                                 | top-1  | parameters (paper) |
|-----------------|---------------------------------------|--------|--------------------|
| cait            | CaiT, 24 SA + 2 CA layers, inner 256  | 95.38% | 9,020,618          |
| gmm_vit (dflt)  | GMM-ViT, depth 30, dim 192            | 95.45% | 8,917,750          |

locvit's CaiT has exactly 9,020,618 parameters (the official ``CaiT`` defaults: dim 192, 4 heads
of 64 -- the paper's "hidden-dim 256" is that inner width). The GMM-ViT has 8,917,450 parameters
before its GMM parameters (2 K H = 120 per layer, K = 5, H = 12); the paper prints +300.

Recipe: the ``small_vit`` preset, see ``configs/gmm_common.py``.
"""

from __future__ import annotations

import ml_collections

from locvit.configs.args import Field, parse
from locvit.configs.gmm_common import gmm_config, smallvit_name

ROWS = {
  "cait": ("cait_smalldata_patch4_32", "CaiT", 95.38, "9,020,618"),
  "gmm_vit": (smallvit_name("d30w192", "cifar10", "gmm"), "GMM-ViT d30", 95.45, "8,917,750"),
}


ARGS = {"row": Field("gmm_vit", ROWS)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  (row,) = parse(__file__, arg, ARGS).values()
  model, name, top1, params = ROWS[row]
  return gmm_config(model, "cifar10", table="4", row=name, top1=round(top1 / 100, 4), params=params)
