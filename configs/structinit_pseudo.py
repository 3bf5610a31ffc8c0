"""Tables 4 and 7 of Zheng, Li, Lucey: pseudo inputs of the impulse solve, on CIFAR-10.

    --config=configs/structinit_pseudo.py:FIRST,FOLLOWING,MODE,MODEL,FILTER

FIRST / FOLLOWING: pseudo input of the first / the following layers, in {pe, gaussian, uniform,
pe+gaussian, pe+uniform} (Table 4 uses G = trunc-normal std sqrt(0.5) at [-2, 2], Table 7 uses
U = U(-1, 1)); MODE in {same, different} (one Q/K solve shared by the layers, or one per layer);
MODEL in {h3, h8} (ViT-T/h3, ViT-T/h8); FILTER in {3, 5}. Paper, PE/PE same h3 Imp.-3: 90.75.

Recipe: ``structinit_common`` small-dataset recipe (the ``cifar_small`` preset).
"""

from locvit.configs.structinit_common import check_choice, init_block, parse_args, small_data_config
from locvit.init import PSEUDO_INPUTS

MODELS = {"h3": "structvit_tiny_patch2_32", "h8": "structvit_tiny_h8_patch2_32"}


def get_config(arg: str | None = None):
  names = ("first", "following", "mode", "model", "filter")
  first, following, mode, model, size = parse_args(arg, names, ("pe", "pe", "same", "h3", "3"))
  check_choice("pseudo input", first, PSEUDO_INPUTS)
  check_choice("pseudo input", following, PSEUDO_INPUTS)
  check_choice("mode", mode, ("same", "different"))
  check_choice("model", model, MODELS)
  check_choice("filter size", size, ("3", "5"))
  c = small_data_config("cifar10", MODELS[model], "trunc_normal")
  c.init = init_block(f"impulse{size}", mode=mode, pseudo_input=following, pseudo_input_first=first)
  return c
