"""ConViT paper Table 3 (and Fig. 12 right): ablations of ConViT-S+ on the first 100 ImageNet
classes, 300 epochs, DeiT's recipe with the "+" changes (lr 4e-4, batch 512).

  python -m locvit.main --config=configs/convit_table3.py:c --workdir=DIR

=====  ============  =========  ====  ===============  =====  ===========================
row    train gating  conv init  GPSA  train attention  top-1  locvit
=====  ============  =========  ====  ===============  =====  ===========================
a      yes           yes        yes   yes              82.2   convit_small_plus
b      no            yes        yes   yes              82.0   gates frozen at lambda = 0
c      yes           no         yes   yes              81.4   use_local_init=False
d      no            no         yes   yes              81.6   b + c
e      -             -          no    yes              79.1   deit_small_plus (DeiT-S+)
f      -             yes        yes   no               78.6   GPSA attention frozen
g      -             no         yes   no               73.7   f + use_local_init=False
=====  ============  =========  ====  ===============  =====  ===========================

- "Frozen gates" (b, d): every ``gating_param`` is fixed at lambda = 0 (footnote 3: equal
  attention to content and position): ``freeze=('gating_param',)`` plus a zero initial value,
  ``attention_kwargs={'gpsa': {'gating_init': 0.0}}``.
- "Frozen attention" (f, g): every parameter of the 10 GPSA attention modules (q, k, v, proj,
  pos_proj, gates) is frozen at its initial value (``freeze=('^blocks_[0-9]/attn/',)``); patch
  embedding, MLPs, norms, the MHSA layers and the head train. The paper's text swaps the labels
  f and g; the table (used here) has conv init in f.

Data: the first 100 class directories in sorted order of the ImageNet image folder at
``$IMAGENET_ROOT`` (``data.class_limit=100``, see ``configs.convit_common.imagenet100``).
Weight decay: ``decay_mask='official_convit'`` (the ConViT code).
"""

from locvit.configs.args import Field, parse
from locvit.configs.convit_common import imagenet100, paper_config, set_overrides

# row -> (model, frozen gates at 0, conv init, frozen GPSA attention, paper top-1)
ROWS = {
  "a": ("convit_small_plus", False, True, False, 82.2),
  "b": ("convit_small_plus", True, True, False, 82.0),
  "c": ("convit_small_plus", False, False, False, 81.4),
  "d": ("convit_small_plus", True, False, False, 81.6),
  "e": ("deit_small_plus", False, None, False, 79.1),
  "f": ("convit_small_plus", False, True, True, 78.6),
  "g": ("convit_small_plus", False, False, True, 73.7),
}
GPSA_ATTENTION = "^blocks_[0-9]/attn/"  # blocks 0-9: the GPSA layers of ConViT


ARGS = {"row": Field("a", ROWS, "Table 3 row")}


def get_config(arg: str | None = None):
  (row,) = parse(__file__, arg, ARGS).values()
  model, frozen_gate, conv_init, frozen_attention, _ = ROWS[row]
  c = imagenet100(paper_config(model))
  if model.startswith("convit"):
    gpsa = {"locality_strength": 1.0, "use_local_init": conv_init}
    if frozen_gate:
      gpsa["gating_init"] = 0.0
    set_overrides(c, attention_kwargs={"gpsa": gpsa})
  freeze = []
  if frozen_gate:
    freeze.append("gating_param")
  if frozen_attention:
    freeze.append(GPSA_ATTENTION)
  c.freeze = tuple(freeze)
  return c
