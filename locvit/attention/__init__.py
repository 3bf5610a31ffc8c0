"""Geometry -> positional terms -> attention: the convolutional priors of locvit."""

from locvit.attention.attention import (
  COMBINE_RULES,
  Attention,
  get_attention,
  list_attention,
  register_attention,
)
from locvit.attention.geometry import (
  TokenGrid,
  gpsa_relative_features,
  relative_offsets,
  squared_distances,
)
from locvit.attention.gpsa import GPSA as GPSA  # registers attention kinds 'gpsa' and 'psa'
from locvit.attention.masks import GMMAttention as GMMAttention  # registers 'gmm' and 'elm'
from locvit.attention.relative import RelativeAttention as RelativeAttention  # 'quadratic', ...
from locvit.attention.softmax_attention import dot_product_attention, gated_positional_attention

__all__ = [
  "COMBINE_RULES",
  "GPSA",
  "Attention",
  "GMMAttention",
  "RelativeAttention",
  "TokenGrid",
  "dot_product_attention",
  "gated_positional_attention",
  "get_attention",
  "gpsa_relative_features",
  "list_attention",
  "register_attention",
  "relative_offsets",
  "squared_distances",
]
