"""The ViTs of Zheng, Li, Lucey, "Structured Initialization for Attention in Vision Transformers".

timm ViTs with the fixed 2-D sin-cos position embedding and global average pooling (``fc_norm``
before the head, no class token; paper Sec. 5.1 and Table 1), qkv with bias, MLP ratio 4,
LayerNorm eps 1e-6, no stochastic depth (the reference recipe sets none):

- ``structvit_tiny_patch2_32``   ViT-T/h3: dim 192, depth 12, 3 heads (Tables 1-4, 7)
- ``structvit_tiny_h8_patch2_32`` ViT-T/h8: 8 heads of 24 (Tables 3, 4, 7)
- ``structvit_small_patch2_32``  ViT-S/h6: dim 384, 6 heads (Table 3)
- ``structvit_small_h16_patch2_32`` ViT-S/h16: 16 heads of 24 (Table 3)
- ``structvit_tiny_patch16_224`` ViT-T at ImageNet resolution (Table 2, ImageNet-1K)
- ``structvit_d8_dim{64,128,256,512}_h{4,8,16,32}_patch2_32``: depth-8 ViTs (Tables 6, 8)

The paper's ConvMixers (Table 5) live in ``convmixer.py`` and are registered with these models.
Initialise the ViTs with ``locvit.init.apply_init`` (impulse, mimetic, trunc-normal, Kaiming).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn

from locvit.models.vit import VisionTransformer

__all__ = ["structvit"]

# name -> (embed_dim, depth, heads)
SIZES = {
  "tiny": (192, 12, 3),
  "tiny_h8": (192, 12, 8),
  "small": (384, 12, 6),
  "small_h16": (384, 12, 16),
}
DEPTH8_DIMS = (64, 128, 256, 512)
DEPTH8_HEADS = (4, 8, 16, 32)


def structvit(
  num_classes: int, *, embed_dim: int, depth: int, heads: int, patch_size: int
) -> VisionTransformer:
  """Zheng, Li, Lucey's ViT (Sec. 5.1, Table 1): ``depth`` blocks of width ``embed_dim`` with
  ``heads`` heads, MLP ratio 4, qkv bias, fixed 2-D sin-cos position embedding, global average
  pooling, no drop path. Sizes registered: see the module docstring (ViT-T/h3 is 192 / 12 / 3).
  """
  return VisionTransformer(
    num_classes=num_classes,
    patch_size=patch_size,
    embed_dim=embed_dim,
    depth=depth,
    num_heads=heads,
    mlp_ratio=4.0,
    qkv_bias=True,
    pos_embed="sincos2d",
    pool="gap",
    drop_path_rate=0.0,
  )


def _entry(image_size: int, **fields: int) -> tuple[Callable[[int], nn.Module], int]:
  return functools.partial(structvit, **fields), image_size


# name -> (build(num_classes), image size): the sizes at 32 (patch 2), two at 224 (patch 16) and
# the depth-8 width/heads grid.
MODELS = (
  {
    f"structvit_{size}_patch2_32": _entry(32, embed_dim=dim, depth=depth, heads=heads, patch_size=2)
    for size, (dim, depth, heads) in SIZES.items()
  }
  | {
    "structvit_tiny_patch16_224": _entry(224, embed_dim=192, depth=12, heads=3, patch_size=16),
    "structvit_small_patch16_224": _entry(224, embed_dim=384, depth=12, heads=6, patch_size=16),
  }
  | {
    f"structvit_d8_dim{dim}_h{heads}_patch2_32": _entry(
      32, embed_dim=dim, depth=8, heads=heads, patch_size=2
    )
    for dim in DEPTH8_DIMS
    for heads in DEPTH8_HEADS
  }
)
