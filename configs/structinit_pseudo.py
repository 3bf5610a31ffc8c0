"""Tables 4 and 7 of Zheng, Li, Lucey: pseudo inputs of the impulse solve, on CIFAR-10.

    --config=configs/structinit_pseudo.py:FIRST,FOLLOWING,MODE,MODEL,FILTER

FIRST / FOLLOWING: pseudo input of the first / the following layers, in {pe, gaussian, uniform,
pe+gaussian, pe+uniform} (Table 4 uses G = trunc-normal std sqrt(0.5) at [-2, 2], Table 7 uses
U = U(-1, 1)); MODE in {same, different} (one Q/K solve shared by the layers, or one per layer);
MODEL in {h3, h8} (ViT-T/h3, ViT-T/h8); FILTER in {3, 5}. Paper, PE/PE same h3 Imp.-3: 90.75.

Recipe: ``structinit_common`` small-dataset recipe (the ``cifar_small`` preset).
"""

from locvit.configs.args import Field, parse
from locvit.configs.defaults import PSEUDO_INPUTS
from locvit.configs.structinit_common import init_block, small_data_config

MODELS = {"h3": "structvit_tiny_patch2_32", "h8": "structvit_tiny_h8_patch2_32"}


ARGS = {
  "first": Field("pe", PSEUDO_INPUTS, "pseudo input"),
  "following": Field("pe", PSEUDO_INPUTS, "pseudo input"),
  "mode": Field("same", ("same", "different")),
  "model": Field("h3", MODELS),
  "filter": Field("3", ("3", "5"), "filter size"),
}


def get_config(arg: str | None = None):
  first, following, mode, model, size = parse(__file__, arg, ARGS).values()
  c = small_data_config("cifar10", MODELS[model], "trunc_normal")
  c.init = init_block(f"impulse{size}", mode=mode, pseudo_input=following, pseudo_input_first=first)
  return c
