"""Minimal PyTorch ConViT and DeiT following the official forward passes, with timm's names.

For tests and benchmarks (torch is an optional extra). ``state_dict()`` keys equal timm's
``convit_*``, ``deit_*_patch16_224`` and ``deit_*_distilled_patch16_224`` keys, so these models
stand in for real checkpoints in conversion tests, and for timm's models where timm is not
installed (``accelerator.py``). Written from the facts in the shared notes (ConViT section) and
from timm's ``VisionTransformerDistilled`` (timm/models/deit.py); images are NCHW here.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def rel_indices(num_patches: int) -> torch.Tensor:
  """``(1, N, N, 3)`` features ``(dx, dy, dx^2 + dy^2)``, key minus query, row-major patches."""
  side = int(num_patches**0.5)
  ind = torch.arange(side).view(1, -1) - torch.arange(side).view(-1, 1)
  indx = ind.repeat(side, side)
  indy = ind.repeat_interleave(side, dim=0).repeat_interleave(side, dim=1)
  return torch.stack([indx, indy, indx**2 + indy**2], dim=-1).float().unsqueeze(0)


class GPSA(nn.Module):
  def __init__(self, dim, num_heads, qkv_bias=False, locality_strength=1.0, use_local_init=True):
    super().__init__()
    self.num_heads = num_heads
    self.dim = dim
    self.head_dim = dim // num_heads
    self.scale = self.head_dim**-0.5
    self.locality_strength = locality_strength
    self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
    self.v = nn.Linear(dim, dim, bias=qkv_bias)
    self.proj = nn.Linear(dim, dim)
    self.pos_proj = nn.Linear(3, num_heads)
    self.gating_param = nn.Parameter(torch.ones(num_heads))
    self.use_local_init = use_local_init

  def local_init(self):
    self.v.weight.data.copy_(torch.eye(self.dim))
    k = int(self.num_heads**0.5)
    center = (k - 1) / 2 if k % 2 == 0 else k // 2
    for h1 in range(k):
      for h2 in range(k):
        p = h1 + k * h2
        self.pos_proj.weight.data[p, 2] = -1
        self.pos_proj.weight.data[p, 1] = 2 * (h1 - center)
        self.pos_proj.weight.data[p, 0] = 2 * (h2 - center)
    self.pos_proj.weight.data *= self.locality_strength

  def get_attention(self, x):
    B, N, _ = x.shape
    qk = self.qk(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    q, k = qk[0], qk[1]
    pos_score = self.pos_proj(rel_indices(N).expand(B, -1, -1, -1)).permute(0, 3, 1, 2)
    patch_score = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
    pos_score = pos_score.softmax(dim=-1)
    gating = torch.sigmoid(self.gating_param.view(1, -1, 1, 1))
    attn = (1.0 - gating) * patch_score + gating * pos_score
    return attn / attn.sum(dim=-1).unsqueeze(-1)

  def forward(self, x):
    B, N, C = x.shape
    attn = self.get_attention(x)
    v = self.v(x).reshape(B, N, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
    return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class MHSA(nn.Module):
  def __init__(self, dim, num_heads, qkv_bias=False):
    super().__init__()
    self.num_heads = num_heads
    self.scale = (dim // num_heads) ** -0.5
    self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
    self.proj = nn.Linear(dim, dim)

  def forward(self, x):
    B, N, C = x.shape
    qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
    return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
  def __init__(self, dim, hidden):
    super().__init__()
    self.fc1 = nn.Linear(dim, hidden)
    self.fc2 = nn.Linear(hidden, dim)

  def forward(self, x):
    return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU


class Block(nn.Module):
  def __init__(self, dim, num_heads, qkv_bias, use_gpsa, **kwargs):
    super().__init__()
    self.norm1 = nn.LayerNorm(dim, eps=1e-6)
    attn = GPSA if use_gpsa else MHSA
    self.attn = attn(dim, num_heads, qkv_bias=qkv_bias, **kwargs)
    self.norm2 = nn.LayerNorm(dim, eps=1e-6)
    self.mlp = Mlp(dim, 4 * dim)

  def forward(self, x):
    x = x + self.attn(self.norm1(x))
    return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
  def __init__(self, patch_size, dim):
    super().__init__()
    self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

  def forward(self, x):
    return self.proj(x).flatten(2).transpose(1, 2)


def _init_weights(m):
  if isinstance(m, nn.Linear):
    nn.init.trunc_normal_(m.weight, std=0.02)
    if m.bias is not None:
      nn.init.zeros_(m.bias)
  elif isinstance(m, nn.LayerNorm):
    nn.init.ones_(m.weight)
    nn.init.zeros_(m.bias)


class ConViT(nn.Module):
  """timm/official ConViT: GPSA blocks, class token concatenated at ``local_up_to_layer``."""

  def __init__(
    self,
    img_size=224,
    patch_size=16,
    num_classes=1000,
    embed_dim=192,
    depth=12,
    num_heads=4,
    local_up_to_layer=10,
    locality_strength=1.0,
    qkv_bias=False,
  ):
    super().__init__()
    num_patches = (img_size // patch_size) ** 2
    self.local_up_to_layer = local_up_to_layer
    self.patch_embed = PatchEmbed(patch_size, embed_dim)
    self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
    self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, embed_dim))
    self.blocks = nn.ModuleList(
      [
        Block(embed_dim, num_heads, qkv_bias, True, locality_strength=locality_strength)
        if i < local_up_to_layer
        else Block(embed_dim, num_heads, qkv_bias, False)
        for i in range(depth)
      ]
    )
    self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
    self.head = nn.Linear(embed_dim, num_classes)
    nn.init.trunc_normal_(self.pos_embed, std=0.02)
    nn.init.trunc_normal_(self.cls_token, std=0.02)
    self.apply(_init_weights)
    for m in self.modules():
      if isinstance(m, GPSA) and m.use_local_init:
        m.local_init()

  def forward(self, x):
    x = self.patch_embed(x) + self.pos_embed
    cls = self.cls_token.expand(x.shape[0], -1, -1)
    for i, blk in enumerate(self.blocks):
      if i == self.local_up_to_layer:
        x = torch.cat((cls, x), dim=1)
      x = blk(x)
    return self.head(self.norm(x)[:, 0])


class DeiT(nn.Module):
  """timm VisionTransformer as used by DeiT: class token and pos_embed at the input."""

  num_prefix_tokens = 1  # rows of pos_embed before the patches

  def __init__(
    self, img_size=224, patch_size=16, num_classes=1000, embed_dim=192, depth=12, num_heads=3
  ):
    super().__init__()
    num_patches = (img_size // patch_size) ** 2
    self.patch_embed = PatchEmbed(patch_size, embed_dim)
    self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
    self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_prefix_tokens, embed_dim))
    self.blocks = nn.ModuleList([Block(embed_dim, num_heads, True, False) for _ in range(depth)])
    self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
    self.head = nn.Linear(embed_dim, num_classes)
    nn.init.trunc_normal_(self.pos_embed, std=0.02)
    nn.init.trunc_normal_(self.cls_token, std=0.02)
    self.apply(_init_weights)

  def prefix_tokens(self, batch: int) -> list[torch.Tensor]:
    return [self.cls_token.expand(batch, -1, -1)]

  def forward_features(self, x):
    """The normalised tokens: prefix tokens concatenated before the patches, then pos_embed."""
    x = self.patch_embed(x)
    x = torch.cat((*self.prefix_tokens(x.shape[0]), x), dim=1) + self.pos_embed
    for blk in self.blocks:
      x = blk(x)
    return self.norm(x)

  def forward_head(self, x):
    return self.head(x[:, 0])

  def forward(self, x):
    return self.forward_head(self.forward_features(x))


class DistilledDeiT(DeiT):
  """timm's ``VisionTransformerDistilled`` (``deit_*_distilled_*``): a distillation token
  ``dist_token`` right after the class token, pos_embed rows for both, and a second classifier
  ``head_dist`` reading the distillation token. Its output is the mean of the two heads' logits,
  except in training with ``distilled_training`` on, where it is the pair
  ``(class_logits, distillation_logits)``."""

  num_prefix_tokens = 2

  def __init__(self, num_classes=1000, embed_dim=192, **kwargs):
    super().__init__(num_classes=num_classes, embed_dim=embed_dim, **kwargs)
    self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
    self.head_dist = nn.Linear(embed_dim, num_classes)
    self.distilled_training = False
    nn.init.trunc_normal_(self.dist_token, std=0.02)
    self.head_dist.apply(_init_weights)

  def prefix_tokens(self, batch: int) -> list[torch.Tensor]:
    return [*super().prefix_tokens(batch), self.dist_token.expand(batch, -1, -1)]

  def forward_head(self, x):
    logits, dist_logits = self.head(x[:, 0]), self.head_dist(x[:, 1])
    if self.distilled_training and self.training:
      return logits, dist_logits
    return (logits + dist_logits) / 2


CONVIT_SIZES = {"tiny": (4, 48), "small": (9, 48), "base": (16, 48)}
DEIT_SIZES = {"tiny": 3, "small": 6, "base": 12}


def build(model_name: str, **kwargs) -> nn.Module:
  """``convit_{tiny,small,base}``, ``deit_{tiny,small,base}`` or
  ``deit_{tiny,small,base}_distilled``, with optional size overrides."""
  family, size = model_name.split("_", 1)
  if family == "convit":
    heads, head_dim = CONVIT_SIZES[size]
    return ConViT(embed_dim=heads * head_dim, num_heads=heads, **kwargs)
  size, distilled = size.removesuffix("_distilled"), size.endswith("_distilled")
  heads = DEIT_SIZES[size]
  return (DistilledDeiT if distilled else DeiT)(embed_dim=64 * heads, num_heads=heads, **kwargs)


def perturb_(model: nn.Module, scale: float = 0.05, seed: int = 0) -> nn.Module:
  """Adds noise to every parameter so identity/zero/one inits cannot hide conversion bugs."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(scale * torch.randn(p.shape, generator=gen))
  return model


def num_params(model: nn.Module) -> int:
  return sum(math.prod(p.shape) for p in model.parameters())


def resample_abs_pos_embed(posemb: torch.Tensor, new_size, num_prefix_tokens: int = 1):
  """timm's ``resample_abs_pos_embed``: the prefix rows kept, the square patch grid resized by
  ``F.interpolate(bicubic, antialias=True)``."""
  prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
  side = int(math.sqrt(grid.shape[1]))
  grid = grid.reshape(1, side, side, -1).permute(0, 3, 1, 2)
  grid = F.interpolate(grid.float(), size=tuple(new_size), mode="bicubic", antialias=True)
  return torch.cat([prefix, grid.permute(0, 2, 3, 1).reshape(1, -1, posemb.shape[-1])], dim=1)


def timm_eval_transform(image, size: int, crop_pct: float, mean, std) -> torch.Tensor:
  """timm's ``create_transform(is_training=False)`` for a square ``size`` and 'center' crop, as
  torchvision computes it: ``Resize(floor(size / crop_pct))`` on the shorter side (the longer one
  ``int(short * long / shorter)``, PIL bicubic), ``CenterCrop(size)`` (offset
  ``int(round((n - size) / 2))``), ``ToTensor`` (``/ 255``), ``Normalize``. CHW float32."""
  from PIL import Image

  scale = math.floor(size / crop_pct)
  w, h = image.size
  shorter, longer = (w, h) if w <= h else (h, w)
  new_short, new_long = scale, int(scale * longer / shorter)
  new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
  if (new_w, new_h) != (w, h):
    image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
  top, left = round((new_h - size) / 2.0), round((new_w - size) / 2.0)
  image = image.crop((left, top, left + size, top + size))
  x = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
  x = x.to(torch.float32).div(255)
  mean, std = torch.tensor(mean), torch.tensor(std)
  return (x - mean[:, None, None]) / std[:, None, None]
