"""ConViT paper Table 1: the twelve models trained from scratch on ImageNet-1k, 300 epochs.

  python -m locvit.main --config=configs/convit_table1.py:convit_tiny_plus --workdir=DIR

Rows (argument: model, paper's size and top-1):

  ===================  ======  =====    ===================  ======  =====
  deit_tiny (*)          6M    72.2     convit_tiny            6M    73.1
  deit_tiny_plus        10M    75.9     convit_tiny_plus      10M    76.7
  deit_small (*)        22M    79.8     convit_small          27M    81.3
  deit_small_plus       48M    79.0     convit_small_plus     48M    82.2
  deit_base (*)         86M    81.8     convit_base           86M    82.4
  deit_base_plus       152M    77.5     convit_base_plus     152M    82.5
  ===================  ======  =====    ===================  ======  =====

(*) numbers from the DeiT paper, trained with DeiT's code: weight decay with the intended mask.
All other rows were trained with the ConViT code: ``decay_mask='official_convit'``. DeiT's recipe
(the ``deit`` preset of ``configs/recipes.py``); the "+" models
use lr 4e-4 and batch 512. ImageNet through TFDS ``imagenet2012`` (see ``convit_s.py``).
"""

from locvit.configs.args import Field, parse
from locvit.configs.convit_common import imagenet, paper_config

# name -> (paper top-1, paper parameters in millions)
ROWS = {
  "deit_tiny": (72.2, 6),
  "convit_tiny": (73.1, 6),
  "deit_tiny_plus": (75.9, 10),
  "convit_tiny_plus": (76.7, 10),
  "deit_small": (79.8, 22),
  "convit_small": (81.3, 27),
  "deit_small_plus": (79.0, 48),
  "convit_small_plus": (82.2, 48),
  "deit_base": (81.8, 86),
  "convit_base": (82.4, 86),
  "deit_base_plus": (77.5, 152),
  "convit_base_plus": (82.5, 152),
}
DEIT_PAPER_ROWS = ("deit_tiny", "deit_small", "deit_base")


ARGS = {"row": Field("convit_small", ROWS, "Table 1 row")}


def get_config(arg: str | None = None):
  (name,) = parse(__file__, arg, ARGS).values()
  mask = "intended" if name in DEIT_PAPER_ROWS else "official_convit"
  return imagenet(paper_config(name, decay_mask=mask))
