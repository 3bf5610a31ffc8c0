"""Tables 4 and 7 of Zheng, Li, Lucey: pseudo inputs of the impulse solve, on CIFAR-10.

    --config=configs/structinit_pseudo.py:FIRST,FOLLOWING,MODE,MODEL,FILTER

FIRST / FOLLOWING: pseudo input of the first / the following layers, in {pe, gaussian, uniform,
pe+gaussian, pe+uniform} (Table 4 uses G = trunc-normal std sqrt(0.5) at [-2, 2], Table 7 uses
U = U(-1, 1)); MODE in {same, different} (one Q/K solve shared by the layers, or one per layer);
MODEL in {h3, h8} (ViT-T/h3, ViT-T/h8); FILTER in {3, 5}. Paper, PE/PE same h3 Imp.-3: 90.75.

Recipe: ``structinit_common`` small-dataset recipe (the ``cifar_small`` preset).
"""

from locvit.configs.args import choose, parse
from locvit.configs.defaults import PSEUDO_INPUTS
from locvit.configs.structinit_common import init_block, small_data_config

MODELS = {"h3": "structvit_tiny_patch2_32", "h8": "structvit_tiny_h8_patch2_32"}


def get_config(arg: str | None = None):
  fields = {"first": "pe", "following": "pe", "mode": "same", "model": "h3", "filter": "3"}
  first, following, mode, model, size = parse(__file__, arg, fields).values()
  choose(__file__, "pseudo input", first, PSEUDO_INPUTS)
  choose(__file__, "pseudo input", following, PSEUDO_INPUTS)
  choose(__file__, "mode", mode, ("same", "different"))
  choose(__file__, "model", model, MODELS)
  choose(__file__, "filter size", size, ("3", "5"))
  c = small_data_config("cifar10", MODELS[model], "trunc_normal")
  c.init = init_block(f"impulse{size}", mode=mode, pseudo_input=following, pseudo_input_first=first)
  return c
