"""DeiT sizes (Touvron et al. 2021) and the ConViT paper's "+" sizes, at ImageNet and small-image
resolutions. All use 64 channels per head, depth 12, MLP ratio 4 and a class token."""

from __future__ import annotations

import functools

from locvit.models.vit import VisionTransformer

# name -> heads (64 per head). DeiT-Ti/S/B, and the "+" sizes of ConViT Table 1.
DEIT_HEADS = {"tiny": 3, "small": 6, "base": 12, "tiny_plus": 4, "small_plus": 9, "base_plus": 16}
# (patch size, image size): ImageNet and the small-image variants (CIFAR 32x32, 64x64).
RESOLUTIONS = ((16, 224), (4, 32), (2, 32), (8, 64))


def deit(num_classes: int, *, heads: int, patch_size: int) -> VisionTransformer:
  """A DeiT ViT with ``heads`` heads of 64 (embed ``64 * heads``), depth 12, MLP ratio 4, qkv bias,
  learned position embedding, class-token pooling, drop path 0.1.

  ``heads`` 3 / 6 / 12 give DeiT-Ti / S / B (Touvron et al. 2021, Table 1); 4 / 9 / 16 the "+"
  sizes of ConViT Table 1 (Ti+ 256, S+ 576, B+ 1024 wide). Registered as ``deit_{size}`` (patch 16
  at 224) and ``deit_{size}_patch{p}_{res}`` for the resolutions in ``RESOLUTIONS``.
  """
  return VisionTransformer(
    num_classes=num_classes,
    patch_size=patch_size,
    embed_dim=64 * heads,
    depth=12,
    num_heads=heads,
    mlp_ratio=4.0,
    qkv_bias=True,
    pos_embed="learn",
    pool="token",
    drop_path_rate=0.1,
  )


# name -> (build(num_classes), image size): deit_{size}_patch{p}_{res} and timm's deit_{size}.
MODELS = {
  f"deit_{size}_patch{patch}_{res}": (functools.partial(deit, heads=heads, patch_size=patch), res)
  for size, heads in DEIT_HEADS.items()
  for patch, res in RESOLUTIONS
} | {
  f"deit_{size}": (functools.partial(deit, heads=heads, patch_size=16), 224)
  for size, heads in DEIT_HEADS.items()
}
