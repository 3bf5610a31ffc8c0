"""Geometry -> positional terms -> attention core: the convolutional priors of locvit.

Positional terms (Linen modules called as ``term(grid)``, returning ``(H, N, N)`` tables):
``QuadraticPositional`` and ``LearnedRelativePositional`` (Cordonnier et al.),
``GaussianMixtureMask`` and ``ElementwiseMask`` (Li & Zhang); GPSA's gated term lives in its layer.
They plug into ``Attention(positional=term, combine=...)``, which hands them to the attention core
(``attend``, ``Term``, ``LogitsHook``; see ``locvit/attention/core.py``).
"""

from locvit.attention.attention import (
  Attention,
  get_attention,
  list_attention,
  register_attention,
)
from locvit.attention.core import COMBINE_RULES, LogitsHook, Term, attend
from locvit.attention.geometry import (
  TokenGrid,
  gpsa_relative_features,
  relative_offsets,
  squared_distances,
)
from locvit.attention.gpsa import GPSA as GPSA  # registers attention kinds 'gpsa' and 'psa'
from locvit.attention.masks import (  # registers 'gmm' and 'elm'
  ElementwiseMask,
  ELMAttention,
  GaussianMixtureMask,
  GMMAttention,
)
from locvit.attention.projections import DenseGeneral
from locvit.attention.relative import (  # registers 'quadratic', ...
  LearnedRelativePositional,
  QuadraticPositional,
  RelativeAttention,
)
from locvit.attention.softmax_attention import dot_product_attention, gated_positional_attention

__all__ = [
  "COMBINE_RULES",
  "GPSA",
  "Attention",
  "DenseGeneral",
  "ELMAttention",
  "ElementwiseMask",
  "GMMAttention",
  "GaussianMixtureMask",
  "LearnedRelativePositional",
  "LogitsHook",
  "QuadraticPositional",
  "RelativeAttention",
  "Term",
  "TokenGrid",
  "attend",
  "dot_product_attention",
  "gated_positional_attention",
  "get_attention",
  "gpsa_relative_features",
  "list_attention",
  "register_attention",
  "relative_offsets",
  "squared_distances",
]
