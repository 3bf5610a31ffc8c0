"""Tables 6 and 8 of Zheng, Li, Lucey: depth-8 ViTs, heads x embedding dims, on CIFAR-10.

    --config=configs/structinit_heads.py:DIM,HEADS,INIT

DIM in {64, 128} (Table 8) or {256, 512} (Table 6); HEADS in {4, 8, 16, 32}; INIT in
{trunc_normal, kaiming_uniform, mimetic, impulse3, impulse5}. Patch 2 on 32x32, sin-cos PE and
global average pooling (``structvit_d8_dim{DIM}_h{HEADS}_patch2_32``). Paper, dim 256 h8 Imp.-3:
90.67; dim 512 h16 Imp.-5: 91.87.

Recipe: ``structinit_common`` small-dataset recipe (the ``cifar_small`` preset).
"""

from locvit.configs.args import choose, parse
from locvit.configs.structinit_common import INITS, small_data_config


def get_config(arg: str | None = None):
  fields = {"dim": "256", "heads": "8", "init": "impulse3"}
  dim, heads, init = parse(__file__, arg, fields).values()
  choose(__file__, "dim", dim, ("64", "128", "256", "512"))
  choose(__file__, "heads", heads.removeprefix("h"), ("4", "8", "16", "32"))
  choose(__file__, "init", init, INITS)
  model = f"structvit_d8_dim{dim}_h{heads.removeprefix('h')}_patch2_32"
  return small_data_config("cifar10", model, init)
