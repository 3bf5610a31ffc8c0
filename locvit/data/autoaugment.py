"""RandAugment and AutoAugment on uint8 HWC images (PIL), deterministic given a NumPy generator.

`data.auto_augment` takes one of these strings (None: off); it runs after the recipe's crop and
flip, on training images only:

  'rand-<sections>'    RandAugment (Cubuk et al. 2020) as timm's `rand_augment_transform`, e.g.
                       DeiT's 'rand-m9-mstd0.5-inc1'. Sections (any order, each once):
                         m<int>    magnitude, 0..10 (default 10), or 0..mmax when mmax is given;
                         n<int>    ops per image, >= 1 (default 2), drawn with replacement;
                         p<float>  probability of applying each drawn op, 0..1 (default 0.5);
                         mstd<f>   std of Gaussian noise on the magnitude (default 0); > 100
                                   samples uniformly in [0, m], as timm;
                         mmax<int> upper clip of the noisy magnitude, 1..30 (default 10);
                         inc<0|1>  1: the "increasing severity" op set (default 0). timm reads
                                   any value as on (bool('0') is True); here inc0 is off.
  '{original,originalr,v0,v0r}[-mstd<f>]'
                       timm's AutoAugment ImageNet policies with timm's level mapping: 'original'
                       is the AutoAugment paper's ImageNet policy (posterize keeps 4..8 bits),
                       'v0' the TPU EfficientNet one, the 'r' variants use the increasing
                       posterize.
  'autoaug-cifar10', 'autoaug-svhn', 'autoaug-imagenet'
                       the AutoAugment paper's (Cubuk et al. 2019) CIFAR-10, SVHN and ImageNet
                       policies with torchvision's `AutoAugment` magnitude bins (10 bins, signed
                       geometric and enhance ops, posterize 8..4 bits, solarize 255..0), which is
                       also the `CIFAR10Policy`/`SVHNPolicy`/`ImageNetPolicy` used by the GMM
                       paper's official code.

Fill and resampling of the geometric ops (rotate, shear, translate) follow timm's
`create_transform`, which is how DeiT/ConViT call it: the fill is round(255 * data.mean) per
channel and the resampling is data.interpolation. `data.auto_augment_fill` = k (0..255) fills with
k on every channel instead: 128 is timm's `AugmentOp` default and the GMM code's, 0 torchvision's.

Every random choice (which ops, whether each applies, magnitude noise, sign) is drawn from the
`np.random.Generator` passed in, in timm's order, so a transform is a pure function of the image and
the generator state. 1-channel images work (Color is then the identity); other channel counts raise.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from locvit.data.augment import from_pil, register_op, to_pil

LEVEL_DENOM = 10.0  # timm's _LEVEL_DENOM: magnitude m maps to the fraction m / 10 of each range.
MAX_MMAX = 30  # Largest accepted mmax; past ~10 most ops saturate (rotate 90 deg at 30).
_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


class _Ctx(NamedTuple):
  fill: int | tuple[int, ...]  # int for mode "L", 3-tuple for "RGB".
  resample: Image.Resampling


# ----------------------------------------------------------------------------- PIL primitives
# Each takes (PIL image, argument, ctx) and returns a PIL image. The identity cases return the
# input as is (PIL would too, up to a copy), so magnitude 0 is exactly a no-op.


def _affine(img: Image.Image, data: tuple[float, ...], ctx: _Ctx) -> Image.Image:
  return img.transform(
    img.size, Image.Transform.AFFINE, data, resample=ctx.resample, fillcolor=ctx.fill
  )


def _shear_x(img: Image.Image, factor: float, ctx: _Ctx) -> Image.Image:
  return img if factor == 0 else _affine(img, (1, factor, 0, 0, 1, 0), ctx)


def _shear_y(img: Image.Image, factor: float, ctx: _Ctx) -> Image.Image:
  return img if factor == 0 else _affine(img, (1, 0, 0, factor, 1, 0), ctx)


def _translate_x(img: Image.Image, pixels: float, ctx: _Ctx) -> Image.Image:
  # Output pixel x samples input x + pixels: positive moves the content left.
  return img if pixels == 0 else _affine(img, (1, 0, pixels, 0, 1, 0), ctx)


def _translate_y(img: Image.Image, pixels: float, ctx: _Ctx) -> Image.Image:
  return img if pixels == 0 else _affine(img, (1, 0, 0, 0, 1, pixels), ctx)


def _rotate(img: Image.Image, degrees: float, ctx: _Ctx) -> Image.Image:
  # Counter-clockwise about the centre, same size.
  return img if degrees == 0 else img.rotate(degrees, resample=ctx.resample, fillcolor=ctx.fill)


def _lut(img: Image.Image, lut: Sequence[int]) -> Image.Image:
  return img.point(list(lut) * len(img.getbands()))


def _posterize(img: Image.Image, bits: int, ctx: _Ctx) -> Image.Image:
  # Keeps the `bits` most significant bits; bits <= 0 gives black (Pillow < 11's rule, which
  # timm's level mapping relies on; Pillow >= 11 rejects bits outside 1..8).
  bits = int(bits)
  if bits >= 8:
    return img
  mask = 0 if bits <= 0 else (0xFF << (8 - bits)) & 0xFF
  return _lut(img, [i & mask for i in range(256)])


def _solarize(img: Image.Image, threshold: float, ctx: _Ctx) -> Image.Image:
  # Inverts every value >= threshold.
  if threshold >= 256:
    return img
  return _lut(img, [i if i < threshold else 255 - i for i in range(256)])


def _solarize_add(img: Image.Image, add: int, ctx: _Ctx, threshold: int = 128) -> Image.Image:
  # Adds `add` (saturating) to every value < threshold.
  if add == 0:
    return img
  return _lut(img, [min(255, i + add) if i < threshold else i for i in range(256)])


def _enhancer(cls: type) -> Callable[[Image.Image, float, _Ctx], Image.Image]:
  def op(img: Image.Image, factor: float, ctx: _Ctx) -> Image.Image:
    return img if factor == 1.0 else cls(img).enhance(factor)

  return op


PRIMITIVES: dict[str, Callable[..., Image.Image]] = {
  "AutoContrast": lambda img, arg, ctx: ImageOps.autocontrast(img),
  "Equalize": lambda img, arg, ctx: ImageOps.equalize(img),
  "Invert": lambda img, arg, ctx: ImageOps.invert(img),
  "Rotate": _rotate,
  "Posterize": _posterize,
  "Solarize": _solarize,
  "SolarizeAdd": _solarize_add,
  "Color": _enhancer(ImageEnhance.Color),
  "Contrast": _enhancer(ImageEnhance.Contrast),
  "Brightness": _enhancer(ImageEnhance.Brightness),
  "Sharpness": _enhancer(ImageEnhance.Sharpness),
  "ShearX": _shear_x,
  "ShearY": _shear_y,
  "TranslateX": _translate_x,
  "TranslateY": _translate_y,
}


def _context(channels: int, fill: Sequence[int], interpolation: str) -> _Ctx:
  if channels not in (1, 3):
    raise ValueError(f"data.auto_augment works on 1- or 3-channel images, got {channels} channels")
  fill = tuple(int(v) for v in fill)
  if len(fill) == 1:
    fill = fill * 3
  value: int | tuple[int, ...] = round(sum(fill) / len(fill)) if channels == 1 else fill
  return _Ctx(value, _RESAMPLE[interpolation])


def apply_op(
  image: np.ndarray,
  name: str,
  arg: float | None = None,
  *,
  fill: Sequence[int] = (128, 128, 128),
  interpolation: str = "bilinear",
) -> np.ndarray:
  """Applies primitive `name` (a key of PRIMITIVES) with the explicit argument `arg`.

  Arguments are the ops' own units: degrees, shear factor, pixels (TranslateX/Y: the output
  samples the input that many pixels further along the axis), enhance factor (1 = identity), bits,
  threshold, added value.
  """
  if name not in PRIMITIVES:
    raise ValueError(f"unknown augmentation op {name!r}; known: {sorted(PRIMITIVES)}")
  ctx = _context(image.shape[2], fill, interpolation)
  return from_pil(PRIMITIVES[name](to_pil(image), arg, ctx), image.shape[2])


# ----------------------------------------------------------------------------- timm ops


def _negate(value: float, rng: np.random.Generator) -> float:
  return -value if rng.random() > 0.5 else value  # timm: random.random() > 0.5


def _frac(level: float) -> float:
  return level / LEVEL_DENOM


# timm op name -> (primitive, level -> argument). The level functions are timm's ranges.
_TIMM_LEVELS: dict[str, tuple[str, Callable[[float, Any, Any], Any] | None]] = {
  "AutoContrast": ("AutoContrast", None),
  "Equalize": ("Equalize", None),
  "Invert": ("Invert", None),
  "Rotate": ("Rotate", lambda lv, rng, img: _negate(_frac(lv) * 30.0, rng)),  # [-30, 30] deg
  "Posterize": ("Posterize", lambda lv, rng, img: int(_frac(lv) * 4)),  # keep 0..4 bits
  "PosterizeIncreasing": ("Posterize", lambda lv, rng, img: 4 - int(_frac(lv) * 4)),  # 4..0
  "PosterizeOriginal": ("Posterize", lambda lv, rng, img: int(_frac(lv) * 4) + 4),  # 4..8
  "Solarize": ("Solarize", lambda lv, rng, img: min(256, int(_frac(lv) * 256))),  # 0..256
  "SolarizeIncreasing": (
    "Solarize",
    lambda lv, rng, img: 256 - min(256, int(_frac(lv) * 256)),  # 256..0
  ),
  "SolarizeAdd": ("SolarizeAdd", lambda lv, rng, img: min(128, int(_frac(lv) * 110))),  # 0..110
  "ShearX": ("ShearX", lambda lv, rng, img: _negate(_frac(lv) * 0.3, rng)),  # [-0.3, 0.3]
  "ShearY": ("ShearY", lambda lv, rng, img: _negate(_frac(lv) * 0.3, rng)),
  # +-45% of the width / height (timm's translate_pct default).
  "TranslateXRel": (
    "TranslateX",
    lambda lv, rng, img: _negate(_frac(lv) * 0.45, rng) * img.size[0],
  ),
  "TranslateYRel": (
    "TranslateY",
    lambda lv, rng, img: _negate(_frac(lv) * 0.45, rng) * img.size[1],
  ),
}
for _kind in ("Color", "Contrast", "Brightness", "Sharpness"):
  # Factor 0.1..1.9 growing with the level; "Increasing": 1 -+ 0.9 level, at least 0.1.
  _TIMM_LEVELS[_kind] = (_kind, lambda lv, rng, img: _frac(lv) * 1.8 + 0.1)
  _TIMM_LEVELS[_kind + "Increasing"] = (
    _kind,
    lambda lv, rng, img: max(0.1, 1.0 + _negate(_frac(lv) * 0.9, rng)),
  )

RAND_TRANSFORMS = (
  "AutoContrast",
  "Equalize",
  "Invert",
  "Rotate",
  "Posterize",
  "Solarize",
  "SolarizeAdd",
  "Color",
  "Contrast",
  "Brightness",
  "Sharpness",
  "ShearX",
  "ShearY",
  "TranslateXRel",
  "TranslateYRel",
)
_INCREASING = {
  "Posterize": "PosterizeIncreasing",
  "Solarize": "SolarizeIncreasing",
  "Color": "ColorIncreasing",
  "Contrast": "ContrastIncreasing",
  "Brightness": "BrightnessIncreasing",
  "Sharpness": "SharpnessIncreasing",
}
RAND_INCREASING_TRANSFORMS = tuple(_INCREASING.get(n, n) for n in RAND_TRANSFORMS)


@dataclasses.dataclass(frozen=True)
class AugmentOp:
  """timm's `AugmentOp`: with probability `prob`, the op at a (noisy) magnitude.

  The magnitude gets N(0, magnitude_std) noise (uniform in [0, magnitude] when magnitude_std is
  inf) and is clipped to [0, magnitude_max or 10]; signed ops then flip sign with probability 1/2.
  """

  name: str
  prob: float = 0.5
  magnitude: float = 10.0
  magnitude_std: float = 0.0
  magnitude_max: float | None = None

  def __post_init__(self) -> None:
    if self.name not in _TIMM_LEVELS:
      raise ValueError(f"unknown timm augmentation op {self.name!r}; known: {sorted(_TIMM_LEVELS)}")

  def __call__(self, img: Image.Image, rng: np.random.Generator, ctx: _Ctx) -> Image.Image:
    if self.prob < 1.0 and rng.random() > self.prob:
      return img
    magnitude = self.magnitude
    if self.magnitude_std == math.inf:
      magnitude = rng.uniform(0.0, magnitude)
    elif self.magnitude_std > 0:
      magnitude = rng.normal(magnitude, self.magnitude_std)
    magnitude = max(0.0, min(magnitude, self.magnitude_max or LEVEL_DENOM))
    primitive, level_fn = _TIMM_LEVELS[self.name]
    arg = None if level_fn is None else level_fn(magnitude, rng, img)
    return PRIMITIVES[primitive](img, arg, ctx)


def augment_op(
  image: np.ndarray,
  name: str,
  magnitude: float,
  rng: np.random.Generator,
  *,
  fill: Sequence[int] = (128, 128, 128),
  interpolation: str = "bilinear",
) -> np.ndarray:
  """timm op `name` at `magnitude` (0..10), always applied, no magnitude noise."""
  ctx = _context(image.shape[2], fill, interpolation)
  img = AugmentOp(name, prob=1.0, magnitude=magnitude)(to_pil(image), rng, ctx)
  return from_pil(img, image.shape[2])


class _PilTransform:
  """Base: converts to PIL once, runs `_apply` (PIL -> PIL) and converts back."""

  def __init__(self, fill: Sequence[int], interpolation: str) -> None:
    self.fill, self.interpolation = tuple(fill), interpolation
    self._ctx = {c: _context(c, fill, interpolation) for c in (1, 3)}

  def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    channels = image.shape[2]
    ctx = self._ctx.get(channels) or _context(channels, self.fill, self.interpolation)
    return from_pil(self._apply(to_pil(image), rng, ctx), channels)

  def _apply(self, img: Image.Image, rng: np.random.Generator, ctx: _Ctx) -> Image.Image:
    raise NotImplementedError


class RandAugment(_PilTransform):
  """timm's `RandAugment`: `num_layers` ops drawn uniformly with replacement, applied in order."""

  def __init__(
    self,
    ops: Sequence[AugmentOp],
    num_layers: int = 2,
    *,
    fill: Sequence[int] = (128, 128, 128),
    interpolation: str = "bilinear",
  ) -> None:
    super().__init__(fill, interpolation)
    self.ops, self.num_layers = tuple(ops), int(num_layers)

  def _apply(self, img: Image.Image, rng: np.random.Generator, ctx: _Ctx) -> Image.Image:
    for i in rng.integers(0, len(self.ops), size=self.num_layers):
      img = self.ops[i](img, rng, ctx)
    return img


class AutoAugment(_PilTransform):
  """AutoAugment: one sub-policy drawn uniformly, its ops applied in order."""

  def __init__(
    self,
    policy: Sequence[Sequence[Any]],
    *,
    fill: Sequence[int] = (128, 128, 128),
    interpolation: str = "bilinear",
  ) -> None:
    super().__init__(fill, interpolation)
    self.policy = tuple(tuple(sub) for sub in policy)

  def _apply(self, img: Image.Image, rng: np.random.Generator, ctx: _Ctx) -> Image.Image:
    for op in self.policy[int(rng.integers(0, len(self.policy)))]:
      img = op(img, rng, ctx)
    return img


# ----------------------------------------------------------------------------- paper policies
# (op, probability, magnitude bin 0..9 or None), as in torchvision's AutoAugmentPolicy.

PAPER_POLICIES: dict[str, tuple[tuple[tuple[str, float, int | None], ...], ...]] = {
  "imagenet": (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
  ),
  "cifar10": (
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
    (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
    (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
    (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
    (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
    (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
    (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
    (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
    (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
    (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
    (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
    (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
    (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
  ),
  "svhn": (
    (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
    (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
    (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
    (("Invert", 0.9, None), ("Equalize", 0.6, None)),
    (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
    (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
    (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
    (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
    (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
    (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
    (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
    (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
    (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
    (("Invert", 0.9, None), ("Equalize", 0.6, None)),
    (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
    (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
    (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
    (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
    (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
    (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
    (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
    (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
    (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
    (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
    (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
  ),
}

_BINS = 10
_SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}
_SIGNED |= {"Brightness", "Color", "Contrast", "Sharpness"}


def paper_magnitude(name: str, bin_index: int, width: int, height: int) -> float:
  """torchvision's AutoAugment magnitude of bin `bin_index` (0..9), before the random sign."""
  linear = {
    "ShearX": 0.3,
    "ShearY": 0.3,
    "TranslateX": 150.0 / 331.0 * width,
    "TranslateY": 150.0 / 331.0 * height,
    "Rotate": 30.0,
    "Brightness": 0.9,
    "Color": 0.9,
    "Contrast": 0.9,
    "Sharpness": 0.9,
  }
  if name in linear:
    return linear[name] * bin_index / (_BINS - 1)
  if name == "Posterize":  # 8, 8, 7, 7, 6, 6, 5, 5, 4, 4 bits
    return float(8 - round(bin_index / ((_BINS - 1) / 4)))
  if name == "Solarize":  # Threshold 255 down to 0.
    return 255.0 * (1 - bin_index / (_BINS - 1))
  raise ValueError(f"paper AutoAugment op {name!r} has no magnitude")


@dataclasses.dataclass(frozen=True)
class PaperOp:
  """An op of a paper policy with torchvision's semantics: applied when U(0,1) <= prob."""

  name: str
  prob: float
  bin_index: int | None

  def __call__(self, img: Image.Image, rng: np.random.Generator, ctx: _Ctx) -> Image.Image:
    if rng.random() > self.prob:
      return img
    magnitude = 0.0
    if self.bin_index is not None:
      magnitude = paper_magnitude(self.name, self.bin_index, *img.size)
    if self.name in _SIGNED and rng.integers(0, 2) == 0:
      magnitude = -magnitude
    if self.name in ("TranslateX", "TranslateY"):
      # torchvision moves the content by int(magnitude) pixels (positive: right / down).
      arg: float = -int(magnitude)
    elif self.name in ("Brightness", "Color", "Contrast", "Sharpness"):
      arg = 1.0 + magnitude
    else:
      arg = magnitude
    return PRIMITIVES[self.name](img, arg, ctx)


# timm's AutoAugment ImageNet policies (timm level mapping): 'original' is the paper's ImageNet
# policy with the original posterize; v0 the TPU EfficientNet policy.
_V0 = (
  (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)),
  (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
  (("Color", 0.4, 1), ("Rotate", 0.6, 8)),
  (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
  (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)),
  (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
  (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)),
  (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
  (("Color", 0.6, 1), ("Equalize", 1.0, 2)),
  (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
  (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)),
  (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
  (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)),
  (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
  (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)),
  (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
  (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)),
  (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
  (("Color", 1.0, 0), ("Rotate", 0.6, 2)),
  (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
  (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)),
  (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
  (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)),
  (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
  (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)


def _renamed(policy: Sequence[Sequence[tuple]], rename: dict[str, str]) -> tuple:
  return tuple(
    tuple((rename.get(n, n), p, 0 if m is None else m) for n, p, m in sub) for sub in policy
  )


TIMM_POLICIES: dict[str, tuple] = {
  "original": _renamed(PAPER_POLICIES["imagenet"], {"Posterize": "PosterizeOriginal"}),
  "originalr": _renamed(PAPER_POLICIES["imagenet"], {"Posterize": "PosterizeIncreasing"}),
  "v0": _renamed(_V0, {}),
  "v0r": _renamed(_V0, {"Posterize": "PosterizeIncreasing"}),
}


# ----------------------------------------------------------------------------- spec strings


@dataclasses.dataclass(frozen=True)
class RandAugmentConfig:
  """A parsed 'rand-...' string (see the module docstring)."""

  magnitude: int = 10
  num_layers: int = 2
  prob: float = 0.5
  magnitude_std: float = 0.0
  magnitude_max: int | None = None
  increasing: bool = False


_RAND_KEYS = {"m": int, "n": int, "p": float, "mstd": float, "mmax": int, "inc": int}


def valid_names() -> list[str]:
  """What data.auto_augment accepts (besides None)."""
  return (
    ["rand-<m,n,p,mstd,mmax,inc sections>, e.g. 'rand-m9-mstd0.5-inc1'"]
    + [f"autoaug-{k}" for k in sorted(PAPER_POLICIES)]
    + [f"{k}[-mstd<float>]" for k in sorted(TIMM_POLICIES)]
  )


def _sections(spec: str, keys: dict[str, type]) -> dict[str, Any]:
  """Parses 'KEYvalue' sections (dash separated, after the first) into {key: value}."""
  out: dict[str, Any] = {}
  for section in spec.split("-")[1:]:
    match = re.fullmatch(r"([a-z]+)(\d.*)", section)
    if match is None or match.group(1) not in keys:
      raise ValueError(
        f"data.auto_augment={spec!r}: unknown section {section!r}; valid sections are "
        f"{sorted(keys)} followed by a number"
      )
    key, text = match.groups()
    if key in out:
      raise ValueError(f"data.auto_augment={spec!r}: section {key!r} given twice")
    try:
      out[key] = keys[key](text)
    except ValueError:
      what = "an integer" if keys[key] is int else "a number"
      raise ValueError(
        f"data.auto_augment={spec!r}: {key}{text} needs {what}, got {text!r}"
      ) from None
  return out


def parse_rand_augment(spec: str) -> RandAugmentConfig:
  """Parses and range-checks a timm RandAugment string, e.g. 'rand-m9-mstd0.5-inc1'."""
  if spec.split("-")[0] != "rand":
    raise ValueError(f"data.auto_augment={spec!r} is not a RandAugment string 'rand-...'")
  s = _sections(spec, _RAND_KEYS)

  def bad(what: str) -> ValueError:
    return ValueError(f"data.auto_augment={spec!r}: {what}")

  mmax = s.get("mmax")
  if mmax is not None and not 1 <= mmax <= MAX_MMAX:
    raise bad(f"mmax={mmax} must be in [1, {MAX_MMAX}]")
  bound = mmax or int(LEVEL_DENOM)
  magnitude = s.get("m", int(LEVEL_DENOM))
  if not 0 <= magnitude <= bound:
    hint = "" if mmax else f" (raise the bound with mmax, up to {MAX_MMAX})"
    raise bad(f"magnitude m={magnitude} must be in [0, {bound}]{hint}")
  num_layers = s.get("n", 2)
  if num_layers < 1:
    raise bad(f"n={num_layers} ops per image must be >= 1")
  prob = s.get("p", 0.5)
  if not 0.0 <= prob <= 1.0:
    raise bad(f"p={prob} must be a probability in [0, 1]")
  mstd = s.get("mstd", 0.0)
  if not mstd >= 0.0:  # Also rejects nan.
    raise bad(f"mstd={mstd} must be >= 0")
  inc = s.get("inc", 0)
  if inc not in (0, 1):
    raise bad(f"inc={inc} must be 0 or 1")
  return RandAugmentConfig(
    magnitude=magnitude,
    num_layers=num_layers,
    prob=prob,
    magnitude_std=math.inf if mstd > 100 else mstd,
    magnitude_max=mmax,
    increasing=bool(inc),
  )


def _parse(spec: Any) -> tuple[str, Any]:
  """('rand', RandAugmentConfig) | ('paper', name) | ('timm', (name, mstd)); raises ValueError."""
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"data.auto_augment={spec!r} must be None or one of {valid_names()}")
  head = spec.split("-")[0]
  if head == "rand":
    return "rand", parse_rand_augment(spec)
  if head == "autoaug" and spec[len("autoaug-") :] in PAPER_POLICIES:
    return "paper", spec[len("autoaug-") :]
  if head in TIMM_POLICIES:
    mstd = _sections(spec, {"mstd": float}).get("mstd", 0.0)
    if not mstd >= 0.0:
      raise ValueError(f"data.auto_augment={spec!r}: mstd={mstd} must be >= 0")
    return "timm", (head, mstd)
  raise ValueError(f"data.auto_augment={spec!r} is not one of {valid_names()}")


def check_auto_augment(spec: Any) -> None:
  """Raises ValueError naming the problem and the valid choices unless `spec` is usable."""
  if spec is not None:
    _parse(spec)


def build(
  spec: str, *, fill: Sequence[int] = (128, 128, 128), interpolation: str = "bilinear"
) -> RandAugment | AutoAugment:
  """The transform `fn(image, rng) -> image` for a data.auto_augment string."""
  kind, parsed = _parse(spec)
  kwargs = dict(fill=fill, interpolation=interpolation)
  if kind == "rand":
    names = RAND_INCREASING_TRANSFORMS if parsed.increasing else RAND_TRANSFORMS
    ops = [
      AugmentOp(
        name,
        prob=parsed.prob,
        magnitude=parsed.magnitude,
        magnitude_std=parsed.magnitude_std,
        magnitude_max=parsed.magnitude_max,
      )
      for name in names
    ]
    return RandAugment(ops, parsed.num_layers, **kwargs)
  if kind == "paper":
    policy = [[PaperOp(*op) for op in sub] for sub in PAPER_POLICIES[parsed]]
    return AutoAugment(policy, **kwargs)
  name, mstd = parsed
  std = math.inf if mstd > 100 else mstd
  policy = [
    [AugmentOp(n, p, m, magnitude_std=std) for n, p, m in sub] for sub in TIMM_POLICIES[name]
  ]
  return AutoAugment(policy, **kwargs)


def fill_from_data_config(cfg: Any) -> tuple[int, ...]:
  """data.auto_augment_fill on every channel, else round(255 * data.mean) (timm's rule)."""
  fill = cfg.auto_augment_fill
  if fill is not None:
    return (int(fill),) * 3
  return tuple(min(255, round(255 * float(m))) for m in cfg.mean)


@register_op("auto_augment")
def from_data_config(cfg: Any) -> Callable[[np.ndarray, np.random.Generator], np.ndarray]:
  """The data.auto_augment transform of a data config (the identity when it is None); the op
  "auto_augment" of ``locvit.data.augment``'s registry."""
  spec = cfg.auto_augment
  if spec is None:
    return lambda image, rng: image
  return build(spec, fill=fill_from_data_config(cfg), interpolation=cfg.interpolation)
