"""ConViT paper Table 2 (and Fig. 2 left): sample efficiency of ConViT-S vs DeiT-S on ImageNet.

  python -m locvit.main --config=configs/convit_table2.py:convit_10 --workdir=DIR

Each class keeps its first ``int(n_c * f)`` training images (``data.train_fraction``, the
official subsampling) and the number of epochs is multiplied by 1/f (the trainer divides
``num_epochs=300`` by ``train_fraction``), so every run sees the same number of images. Both
models were trained with the ConViT code: DeiT's recipe, ``decay_mask='official_convit'``.
Evaluation stays on the full validation set, about once per 1.28M training images.

Paper (top-1 / top-5):

  =====  ===========  ===========
  f      DeiT-S       ConViT-S
  =====  ===========  ===========
  5%     34.8 / 57.8  47.8 / 70.7
  10%    48.0 / 71.5  59.6 / 80.3
  30%    66.1 / 86.0  73.7 / 90.7
  50%    74.6 / 91.8  78.2 / 93.8
  100%   79.9 / 95.0  81.4 / 95.8
  =====  ===========  ===========

Argument ``<model>_<percent>``: ``convit_5`` ... ``convit_100``, ``deit_5`` ... ``deit_100``.
"""

from locvit.configs.args import Field, parse
from locvit.configs.convit_common import imagenet, paper_config

PERCENTS = (5, 10, 30, 50, 100)
MODELS = {"convit": "convit_small", "deit": "deit_small"}
# (model, percent) -> (paper top-1, paper top-5)
PAPER = {
  ("deit", 5): (34.8, 57.8),
  ("convit", 5): (47.8, 70.7),
  ("deit", 10): (48.0, 71.5),
  ("convit", 10): (59.6, 80.3),
  ("deit", 30): (66.1, 86.0),
  ("convit", 30): (73.7, 90.7),
  ("deit", 50): (74.6, 91.8),
  ("convit", 50): (78.2, 93.8),
  ("deit", 100): (79.9, 95.0),
  ("convit", 100): (81.4, 95.8),
}
RUNS = {f"{family}_{percent}": (family, percent) for family, percent in PAPER}


ARGS = {"run": Field("convit_10", RUNS, "Table 2 run")}


def get_config(arg: str | None = None):
  (run,) = parse(__file__, arg, ARGS).values()
  family, percent = RUNS[run]
  c = imagenet(paper_config(MODELS[family]))
  # Evaluations stay every ~1.28M images (imagenet()), i.e. every 1/f epochs of the subset.
  c.data.train_fraction = percent / 100
  return c
