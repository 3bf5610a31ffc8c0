"""Table 3 of Zheng, Li, Lucey: larger ViTs and more heads on CIFAR-100.

    --config=configs/structinit_models.py:MODEL,INIT

MODEL in {tiny_h3, tiny_h8, small_h6, small_h16} (ViT-T: dim 192; ViT-S: dim 384; depth 12,
patch 2 on 32x32); INIT in {trunc_normal, kaiming_uniform, mimetic, impulse3, impulse5}.
Paper, Imp.-3: 68.81 / 70.79 / 75.97 / 75.40.

Recipe: ``structinit_common`` small-dataset recipe (the ``cifar_small`` preset).
"""

from locvit.configs.args import Field, parse
from locvit.configs.structinit_common import INITS, small_data_config

MODELS = {
  "tiny_h3": "structvit_tiny_patch2_32",
  "tiny_h8": "structvit_tiny_h8_patch2_32",
  "small_h6": "structvit_small_patch2_32",
  "small_h16": "structvit_small_h16_patch2_32",
}


ARGS = {"model": Field("tiny_h8", MODELS), "init": Field("impulse3", INITS)}


def get_config(arg: str | None = None):
  model, init = parse(__file__, arg, ARGS).values()
  return small_data_config("cifar100", MODELS[model], init)
