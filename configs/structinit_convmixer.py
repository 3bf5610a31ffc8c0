"""Table 5 of Zheng, Li, Lucey: ConvMixer (depth 8, patch 2) depthwise filters on CIFAR-10.

    --config=configs/structinit_convmixer.py:DIM,KERNEL,FILTERS

DIM in {256, 512}; KERNEL in {3, 5, 8}; FILTERS in {trained, random, impulse, box}: trained
U(-1/k, 1/k) filters, or frozen random U(-1/k, 1/k), impulse (one tap, sqrt(1/k)) or box (all taps)
filters; frozen filters keep their bias frozen too (``freeze``). Paper, dim 256, k 3:
91.76 / 90.72 / 90.68 / 81.70. (The reference registers its dim-512 models with depth 6; the
paper's table says depth 8, which is used here.)

Recipe: the small-dataset recipe of ``structinit_common`` with lr 0.01 and 100 epochs (paper
Sec. 5.6). ConvMixer uses BatchNorm: its statistics live in the
``batch_stats`` collection, which the train step must carry (see ``locvit.models.convmixer``).
"""

from locvit.configs.args import Field, parse
from locvit.configs.defaults import FROZEN_FILTERS, init_config
from locvit.configs.structinit_common import small_data_config

FILTERS = ("trained", "random", "impulse", "box")
ARGS = {
  "dim": Field("256", ("256", "512")),
  "kernel": Field("3", ("3", "5", "8")),
  "filters": Field("impulse", FILTERS),
}


def get_config(arg: str | None = None):
  dim, kernel, filters = parse(__file__, arg, ARGS).values()
  c = small_data_config("cifar10", f"convmixer_{dim}_8_k{kernel}_patch2_32", "trunc_normal")
  c.init = init_config("none")  # ConvMixer initialises itself as the reference does
  c.model.overrides.filter_init = "random" if filters == "trained" else filters
  c.freeze = () if filters == "trained" else (FROZEN_FILTERS,)
  c.optimizer.lr = 0.01
  c.num_epochs = 100.0
  return c
