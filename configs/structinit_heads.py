"""Tables 6 and 8 of Zheng, Li, Lucey: depth-8 ViTs, heads x embedding dims, on CIFAR-10.

    --config=configs/structinit_heads.py:DIM,HEADS,INIT

DIM in {64, 128} (Table 8) or {256, 512} (Table 6); HEADS in {4, 8, 16, 32}; INIT in
{trunc_normal, kaiming_uniform, mimetic, impulse3, impulse5}. Patch 2 on 32x32, sin-cos PE and
global average pooling (``structvit_d8_dim{DIM}_h{HEADS}_patch2_32``). Paper, dim 256 h8 Imp.-3:
90.67; dim 512 h16 Imp.-5: 91.87.

Recipe: ``structinit_common`` small-dataset recipe (the ``cifar_small`` preset).
"""

from locvit.configs.args import Field, parse
from locvit.configs.structinit_common import INITS, small_data_config


class _Heads(tuple):
  """The head counts; ``h8`` is accepted for ``8``."""

  def __contains__(self, value: object) -> bool:
    return tuple.__contains__(self, str(value).removeprefix("h"))


ARGS = {
  "dim": Field("256", ("64", "128", "256", "512")),
  "heads": Field("8", _Heads(("4", "8", "16", "32"))),
  "init": Field("impulse3", INITS),
}


def get_config(arg: str | None = None):
  dim, heads, init = parse(__file__, arg, ARGS).values()
  model = f"structvit_d8_dim{dim}_h{heads.removeprefix('h')}_patch2_32"
  return small_data_config("cifar10", model, init)
