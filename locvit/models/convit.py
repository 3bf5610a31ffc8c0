"""ConViT (d'Ascoli et al. 2021): a DeiT whose first layers use gated positional self-attention.

ConViT is ``VisionTransformer`` with ``layer_attention = ('gpsa',) * 10 + ('mhsa',) * 2``, the
class token inserted before layer 10 (``class_token_layer``; ``pos_embed`` then covers the patch
tokens only), no qkv bias and stochastic depth 0.1. Sizes (paper Table 1) use 48 channels per head
(Ti/S/B: 4/9/16 heads) or 64 for the "+" sizes.

Usage::

  create_model('convit_tiny')                                   # 10 GPSA + 2 MHSA, alpha = 1
  create_model('convit_tiny', attention_kwargs={'gpsa': {'locality_strength': 2.0}})
  create_model('convit_tiny', **convit_overrides(local_up_to_layer=6))    # 6 GPSA layers
  create_model('convit_tiny', **convit_overrides(local_up_to_layer=4, depth=6))
  create_model('convit_tiny_patch4_32', num_classes=100)        # CIFAR-size variants

``convit_overrides`` returns the ``layer_attention`` and ``class_token_layer`` fields that
``local_up_to_layer`` stands for in the reference, so any registered ConViT can be re-layered
through ``create_model`` overrides. Use ``attention_kwargs={'gpsa': {'variant': 'psa'}}`` (or
``layer_attention`` with 'psa') for the ungated PSA ablation of the paper's appendix A.
"""

from __future__ import annotations

import functools

# ConViT's layer plan is plain data that configs use too (they must not import JAX).
from locvit.configs.defaults import CONVIT_DEPTH as DEPTH
from locvit.configs.defaults import CONVIT_LOCAL_UP_TO_LAYER as LOCAL_UP_TO_LAYER
from locvit.configs.defaults import convit_overrides
from locvit.models.vit import VisionTransformer

# name -> (heads, channels per head). Ti/S/B and the "+" sizes of ConViT Table 1.
CONVIT_SIZES = {
  "tiny": (4, 48),
  "small": (9, 48),
  "base": (16, 48),
  "tiny_plus": (4, 64),
  "small_plus": (9, 64),
  "base_plus": (16, 64),
}
# (patch size, image size): ImageNet and the small-image variants (CIFAR 32x32, 64x64).
RESOLUTIONS = ((4, 32), (2, 32), (8, 64))


def convit(
  num_classes: int,
  *,
  heads: int,
  head_dim: int = 48,
  patch_size: int = 16,
  local_up_to_layer: int = LOCAL_UP_TO_LAYER,
  depth: int = DEPTH,
  locality_strength: float = 1.0,
) -> VisionTransformer:
  """Builds a ConViT with ``heads * head_dim`` channels (the reference's ``embed_dim``)."""
  return VisionTransformer(
    num_classes=num_classes,
    patch_size=patch_size,
    embed_dim=heads * head_dim,
    num_heads=heads,
    mlp_ratio=4.0,
    qkv_bias=False,
    pos_embed="learn",
    pool="token",
    attention_kwargs={"gpsa": {"locality_strength": locality_strength}},
    drop_path_rate=0.1,
    **convit_overrides(local_up_to_layer, depth),
  )


# name -> (build(num_classes), image size): convit_{size} (timm's), its alias
# convit_{size}_patch16_224 (DeiT's pattern), and convit_{size}_patch{p}_{res}.
MODELS = {
  f"convit_{size}{suffix}": (
    functools.partial(convit, heads=heads, head_dim=head_dim, patch_size=16),
    224,
  )
  for size, (heads, head_dim) in CONVIT_SIZES.items()
  for suffix in ("", "_patch16_224")
} | {
  f"convit_{size}_patch{patch}_{res}": (
    functools.partial(convit, heads=heads, head_dim=head_dim, patch_size=patch),
    res,
  )
  for size, (heads, head_dim) in CONVIT_SIZES.items()
  for patch, res in RESOLUTIONS
}
