"""Table 1 of Zheng, Li, Lucey: ViT-T basic settings on CIFAR-10 (trunc-normal init).

    --config=configs/structinit_table1.py:POS,POOL

POS in {learn, sincos} (learnable vs fixed 2-D sin-cos position embedding), POOL in {token, gap}
(class token vs global average pooling + fc_norm). Paper: learn/token 81.23, learn/gap 82.23,
sincos/token 83.17, sincos/gap 85.30. Default: sincos,gap (the setting used everywhere after).

Recipe: ``structinit_common`` small-dataset recipe (the ``cifar_small`` preset).
"""

from locvit.configs.args import Field, parse
from locvit.configs.structinit_common import small_data_config

ARGS = {
  "pos": Field("sincos", ("learn", "sincos"), "position embedding"),
  "pool": Field("gap", ("token", "gap"), "pooling"),
}


def get_config(arg: str | None = None):
  pos, pool = parse(__file__, arg, ARGS).values()
  c = small_data_config("cifar10", "structvit_tiny_patch2_32", "trunc_normal")
  c.model.overrides.pos_embed = "sincos2d" if pos == "sincos" else "learn"
  c.model.overrides.pool = pool
  return c
