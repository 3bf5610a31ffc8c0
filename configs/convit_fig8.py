"""ConViT paper Fig. 8 (and Fig. 12 left): locality strength and number of GPSA layers.

  python -m locvit.main --config=configs/convit_fig8.py:gpsa=6 --workdir=DIR
  python -m locvit.main --config=configs/convit_fig8.py:alpha=2.0 --workdir=DIR
  python -m locvit.main --config=configs/convit_fig8.py:gpsa=3,alpha=0.5 --workdir=DIR

ConViT-S+ (the Fig. 8 and Fig. 12 captions; the text says ConViT-S: use
``--config.model.name=convit_small`` for that) on the first 100 ImageNet classes, 300 epochs,
DeiT's recipe with the "+" changes. ``gpsa=N`` is ``local_up_to_layer`` (the first N of 12
blocks are GPSA and the class token is inserted before block N; default 10), ``alpha=A`` the
locality strength of Eq. 5 (default 1). The paper reports that final top-1 increases with both
(Fig. 8a) and that, after 20 epochs, 9 GPSA layers almost double the top-1 of none (Fig. 8b);
its grid of values is only shown in the figure. Accuracy at every epoch is in metrics.jsonl.

Data: the first 100 classes of ``$IMAGENET_ROOT`` (``data.class_limit=100``, see
``configs.convit_common.imagenet100``).
"""

from locvit.configs.args import parse
from locvit.configs.convit_common import imagenet100, paper_config, set_overrides
from locvit.configs.defaults import convit_overrides

ARGS = {"gpsa": 10, "alpha": 1.0}
DEPTH = 12


def parse_values(arg: str | None) -> dict[str, float]:
  """``'gpsa=6,alpha=2'`` -> ``{'gpsa': 6, 'alpha': 2.0}`` (missing keys take the defaults)."""
  values = parse(__file__, arg, ARGS)
  if not 0 <= values["gpsa"] <= DEPTH:
    raise ValueError(f"gpsa={values['gpsa']} for convit_fig8.py must be in [0, {DEPTH}].")
  if values["alpha"] < 0:
    raise ValueError(f"alpha={values['alpha']} for convit_fig8.py must be >= 0.")
  return values


def get_config(arg: str | None = None):
  values = parse_values(arg)
  c = imagenet100(paper_config("convit_small_plus"))
  gpsa = {"locality_strength": values["alpha"]}
  set_overrides(c, attention_kwargs={"gpsa": gpsa}, **convit_overrides(values["gpsa"], DEPTH))
  return c
