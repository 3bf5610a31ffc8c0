"""RandAugment and AutoAugment inside the jitted train step, per example, on the uint8 batch.

The device twin of ``locvit.data.autoaugment`` (``data.augment_on='device'`` with
``data.auto_augment`` set): the same spec strings, parsed by that module's parser, the same policy
tables and magnitude mappings (timm's levels for 'rand-...' and 'original'/'v0'..., torchvision's
bins for 'autoaug-*'), the same fill (round(255 * data.mean) or data.auto_augment_fill) and
resampling (data.interpolation).

Each op is a pure function of one image, float32 (H, W, C) holding integer grey levels, and a
traced argument, so magnitudes, signs and op choices differ per example; each op ends by rounding
and clipping as Pillow does. The photometric ops follow Pillow's arithmetic (Image.blend,
ImageEnhance, ImageOps) and agree with the host op within one grey level (most exactly); the
geometric ops sample as Pillow's affine transform (pixel centres at +0.5, clamp-to-edge taps,
the fill where the sample point leaves the image, the bicubic kernel with a = -1, truncation to
uint8) in float32 where Pillow uses float64, so a few pixels land one grey level apart.

dm-pix provides solarize. Its bilinear sampler (``pix.flat_nd_linear_interpolate``) sums the
taps in a reduction whose rounding on XLA CPU varies with the batch shape, so the samplers here
interpolate tap by tap, as Pillow does, and an example's pixels do not depend on its batch. Its
brightness (additive), contrast (per-channel mean),
saturation (HSV) and grayscale (float luma weights) use other formulas than Pillow's enhancers,
and its affine transform has no bicubic mode, so those are written here with Pillow's arithmetic.

Randomness: per example, RandAugment draws n ops uniformly with replacement, applies each with
probability p, with Gaussian magnitude noise (uniform in [0, m] when mstd > 100) clipped to
[0, mmax], and a random sign for signed ops; AutoAugment draws one sub-policy uniformly and
applies its ops each with its own probability. The distributions are the host's; the random
stream is JAX's (``sample_ops`` draws, ``apply_ops`` applies).

Applying the draws to a batch (``dispatch``): a vmap of ``apply_ops`` turns its ``lax.switch``
into a select that computes every op for every example, cheap on small images on an
accelerator; otherwise ``apply_ops_grouped`` sorts the batch by drawn op and runs each op on its
own examples only. Both give the same pixels, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import dm_pix as pix
import jax
import jax.numpy as jnp

from locvit.data import autoaugment

Array = jax.Array
PRIMITIVE_NAMES = tuple(autoaugment.PRIMITIVES)  # lax.switch branch order; one past: identity.
IDENTITY = len(PRIMITIVE_NAMES)
_ENHANCERS = ("Color", "Contrast", "Brightness", "Sharpness")


# ----------------------------------------------------------------------------- Pillow arithmetic


def _to_uint8_levels(values: Array) -> Array:
  """Pillow's float -> uint8 store in Image.blend and the affine filters: clip, then truncate."""
  return jnp.floor(jnp.clip(values, 0.0, 255.0))


def _blend(degenerate: Array, image: Array, factor: Array) -> Array:
  """Image.blend(degenerate, image, factor) as ImageEnhance calls it: float32
  ``degenerate + factor * (image - degenerate)``, clipped and truncated."""
  return _to_uint8_levels(degenerate + factor.astype(jnp.float32) * (image - degenerate))


def _grayscale(image: Array) -> Array:
  """(H, W, 1) Pillow "L" conversion: ITU-R 601-2 luma in 16-bit fixed point
  ((19595 R + 38470 G + 7471 B + 2^15) >> 16); a 1-channel image is its own grayscale."""
  if image.shape[-1] == 1:
    return image
  rgb = image.astype(jnp.int32)
  luma = rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + (1 << 15)
  return (luma >> 16).astype(jnp.float32)[..., None]


def _histogram(channel: Array) -> Array:
  """(256,) int32 counts of the grey levels of one (H, W) channel."""
  levels = channel.astype(jnp.int32).reshape(-1)
  return jnp.zeros(256, jnp.int32).at[levels].add(1)


def _per_channel(fn: Callable[[Array], Array], image: Array) -> Array:
  return jax.vmap(fn, in_axes=-1, out_axes=-1)(image)


# ----------------------------------------------------------------------------- photometric ops


def autocontrast(image: Array, arg: Array) -> Array:
  """ImageOps.autocontrast (cutoff 0): each channel's [min, max] stretched to [0, 255] by
  ``int((x - lo) * 255 / (hi - lo))``; a constant channel is unchanged."""

  def channel(x: Array) -> Array:
    lo, hi = jnp.min(x), jnp.max(x)
    span = jnp.maximum(hi - lo, 1.0)
    return jnp.where(hi > lo, jnp.floor((x - lo) * 255.0 / span), x)

  return _per_channel(channel, image)


def equalize(image: Array, arg: Array) -> Array:
  """ImageOps.equalize, per channel: ``step = (N - count of the highest level present) // 255``,
  level i -> ``(step // 2 + #pixels below i) // step``; identity when step is 0 or one level is
  present."""

  def channel(x: Array) -> Array:
    counts = _histogram(x)
    levels = x.astype(jnp.int32)
    step = (levels.size - counts[jnp.max(levels)]) // 255
    below = jnp.cumsum(counts) - counts
    lut = jnp.minimum((step // 2 + below) // jnp.maximum(step, 1), 255)
    flat = jnp.sum(counts > 0) <= 1
    return jnp.where(flat | (step == 0), x, lut[levels].astype(jnp.float32))

  return _per_channel(channel, image)


def invert(image: Array, arg: Array) -> Array:
  """ImageOps.invert: 255 - x."""
  return 255.0 - image


def posterize(image: Array, bits: Array) -> Array:
  """Keeps the int(bits) most significant bits; <= 0 bits gives black, >= 8 the image (the host's
  Pillow < 11 rule)."""
  keep = jnp.clip(bits.astype(jnp.int32), 0, 8)
  mask = (0xFF << (8 - keep)) & 0xFF
  return (image.astype(jnp.int32) & mask).astype(jnp.float32)


def solarize(image: Array, threshold: Array) -> Array:
  """Inverts every level >= threshold (dm-pix's solarize on [0, 1], exact on integer levels)."""
  return jnp.round(pix.solarize(image / 255.0, threshold / 255.0) * 255.0)


def solarize_add(image: Array, add: Array, threshold: float = 128.0) -> Array:
  """Adds `add` (saturating at 255) to every level < threshold."""
  return jnp.where(image < threshold, jnp.minimum(image + add, 255.0), image)


def color(image: Array, factor: Array) -> Array:
  """ImageEnhance.Color: blend with the grayscale image (the identity on 1 channel)."""
  return _blend(_grayscale(image), image, factor)


def contrast(image: Array, factor: Array) -> Array:
  """ImageEnhance.Contrast: blend with the grey int(mean of the grayscale image + 0.5)."""
  gray = _grayscale(image).astype(jnp.int32)
  total, count = jnp.sum(gray), gray.size
  mean = (2 * total + count) // (2 * count)  # int(total / count + 0.5), exactly
  return _blend(mean.astype(jnp.float32), image, factor)


def brightness(image: Array, factor: Array) -> Array:
  """ImageEnhance.Brightness: blend with black."""
  return _blend(jnp.zeros_like(image), image, factor)


def _smooth(image: Array) -> Array:
  """ImageFilter.SMOOTH: the 3x3 kernel [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13, rounded; the
  one-pixel border keeps the input (Pillow filters only the interior)."""
  height, width, _ = image.shape
  if height < 3 or width < 3:
    return image
  window_sum = sum(
    image[dy : height - 2 + dy, dx : width - 2 + dx] for dy in range(3) for dx in range(3)
  )
  interior = jnp.round((window_sum + 4.0 * image[1:-1, 1:-1]) / 13.0)
  return image.at[1:-1, 1:-1].set(interior)


def sharpness(image: Array, factor: Array) -> Array:
  """ImageEnhance.Sharpness: blend with the SMOOTH-filtered image."""
  return _blend(_smooth(image), image, factor)


# ----------------------------------------------------------------------------- geometric ops


def _cubic(v1: Array, v2: Array, v3: Array, v4: Array, t: Array) -> Array:
  """Pillow's BICUBIC macro: cubic convolution (a = -1) of 4 taps at fraction t past v2."""
  p2 = v3 - v1
  p3 = 2.0 * (v1 - v2) + v3 - v4
  p4 = v2 - v1 + v4 - v3
  return v2 + t * (p2 + t * (p3 + t * p4))


def _sample_bicubic(image: Array, u: Array, v: Array) -> Array:
  """Pillow's bicubic_filter: 4x4 taps around (u, v) (pixel-centre coordinates), each clamped to
  the image, rows interpolated first; (H, W, C). One (H, W, C) gather per tap, so no
  (H, W, 4, 4, C) intermediate."""
  height, width, _ = image.shape
  x0, y0 = jnp.floor(u), jnp.floor(v)
  dx, dy = (u - x0)[..., None], (v - y0)[..., None]
  xs = [jnp.clip(x0.astype(jnp.int32) + k, 0, width - 1) for k in range(-1, 3)]
  ys = [jnp.clip(y0.astype(jnp.int32) + k, 0, height - 1) for k in range(-1, 3)]
  rows = [_cubic(*(image[y, x] for x in xs), dx) for y in ys]
  return _cubic(*rows, dy)


def _sample_bilinear(image: Array, u: Array, v: Array) -> Array:
  """Pillow's bilinear_filter: 2x2 taps around (u, v), each clamped to the image, rows
  interpolated first (``a + (b - a) * d``); (H, W, C). Per-tap arithmetic in a fixed order, as in
  the bicubic sampler: a sum over the taps (dm-pix's sampler) is a reduction whose rounding on
  XLA CPU depends on the batch shape, and an example's pixels must not."""
  height, width, _ = image.shape
  x0, y0 = jnp.floor(u), jnp.floor(v)
  dx, dy = (u - x0)[..., None], (v - y0)[..., None]
  xs = [jnp.clip(x0.astype(jnp.int32) + k, 0, width - 1) for k in range(2)]
  ys = [jnp.clip(y0.astype(jnp.int32) + k, 0, height - 1) for k in range(2)]
  lerp = lambda a, b, t: a + (b - a) * t
  top, bottom = (lerp(image[y, xs[0]], image[y, xs[1]], dx) for y in ys)
  return lerp(top, bottom, dy)


def affine(image: Array, coeffs: Sequence[Array], fill: Array, interpolation: str) -> Array:
  """Image.transform(AFFINE, coeffs): output pixel (x, y) samples the input at
  ``(a X + b Y + c, d X + e Y + f)`` with X = x + 0.5, Y = y + 0.5; points outside
  [0, W) x [0, H) take `fill` (C,), the rest are resampled with `interpolation`."""
  a, b, c, d, e, f = coeffs
  height, width, _ = image.shape
  Y, X = jnp.meshgrid(
    jnp.arange(height, dtype=jnp.float32) + 0.5,
    jnp.arange(width, dtype=jnp.float32) + 0.5,
    indexing="ij",
  )
  x_in, y_in = a * X + b * Y + c, d * X + e * Y + f
  inside = (x_in >= 0) & (x_in < width) & (y_in >= 0) & (y_in < height)
  sample = _sample_bicubic if interpolation == "bicubic" else _sample_bilinear
  values = _to_uint8_levels(sample(image, x_in - 0.5, y_in - 0.5))
  return jnp.where(inside[..., None], values, fill)


def rotate(image: Array, degrees: Array, fill: Array, interpolation: str) -> Array:
  """Image.rotate(degrees): counter-clockwise about (W / 2, H / 2), same size."""
  height, width, _ = image.shape
  angle = -jnp.deg2rad(degrees)
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  cx, cy = width / 2.0, height / 2.0
  coeffs = (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
  return affine(image, coeffs, fill, interpolation)


def _geometric(kind: str) -> Callable[[Array, Array, Array, str], Array]:
  def op(image: Array, arg: Array, fill: Array, interpolation: str) -> Array:
    one, zero = jnp.ones_like(arg), jnp.zeros_like(arg)
    coeffs = {
      "ShearX": (one, arg, zero, zero, one, zero),
      "ShearY": (one, zero, zero, arg, one, zero),
      # The output samples the input `arg` pixels further along the axis (the host's sign).
      "TranslateX": (one, zero, arg, zero, one, zero),
      "TranslateY": (one, zero, zero, zero, one, arg),
    }[kind]
    return affine(image, coeffs, fill, interpolation)

  return op


_PHOTOMETRIC = {
  "AutoContrast": autocontrast,
  "Equalize": equalize,
  "Invert": invert,
  "Posterize": posterize,
  "Solarize": solarize,
  "SolarizeAdd": solarize_add,
  "Color": color,
  "Contrast": contrast,
  "Brightness": brightness,
  "Sharpness": sharpness,
}
_GEOMETRIC = {"Rotate": rotate} | {
  k: _geometric(k) for k in ("ShearX", "ShearY", "TranslateX", "TranslateY")
}


def primitive_branches(
  fill: Sequence[int], interpolation: str
) -> tuple[Callable[[Array, Array], Array], ...]:
  """``fn(image, arg)`` per name of PRIMITIVE_NAMES, then the identity (index IDENTITY)."""
  fill_levels = jnp.asarray(fill, jnp.float32)
  branches = []
  for name in PRIMITIVE_NAMES:
    if name in _PHOTOMETRIC:
      branches.append(_PHOTOMETRIC[name])
    else:
      op = _GEOMETRIC[name]
      branches.append(lambda image, arg, op=op: op(image, arg, fill_levels, interpolation))
  return (*branches, lambda image, arg: image)


def _fill_levels(channels: int, fill: Sequence[int]) -> tuple[int, ...]:
  """The host's fill per channel (a 1-channel image gets the rounded mean of `fill`)."""
  value = autoaugment._context(channels, fill, "bilinear").fill
  return value if isinstance(value, tuple) else (value,)


def apply_primitive(
  image: Array,
  name: str,
  arg: float | Array = 0.0,
  *,
  fill: Sequence[int] = (128, 128, 128),
  interpolation: str = "bilinear",
) -> Array:
  """One primitive on one uint8 (H, W, C) image, in the host ``autoaugment.apply_op``'s units."""
  branches = primitive_branches(_fill_levels(image.shape[-1], fill), interpolation)
  branch = branches[PRIMITIVE_NAMES.index(name)]
  return branch(image.astype(jnp.float32), jnp.asarray(arg, jnp.float32)).astype(jnp.uint8)


# ----------------------------------------------------------------------------- magnitudes


def _signed(value: Array, negate: Array) -> Array:
  return jnp.where(negate, -value, value)


def timm_argument(name: str, width: int, height: int) -> Callable[[Array, Array], Array]:
  """``(level, negate) -> argument`` of timm op `name`: the host's ``_TIMM_LEVELS`` ranges on
  a traced level (``int`` of a non-negative level is its floor)."""
  frac = lambda level: level / autoaugment.LEVEL_DENOM
  bits = lambda level: jnp.floor(frac(level) * 4)
  threshold = lambda level: jnp.minimum(256.0, jnp.floor(frac(level) * 256))
  args: dict[str, Callable[[Array, Array], Array]] = {
    "Rotate": lambda lv, neg: _signed(frac(lv) * 30.0, neg),
    "Posterize": lambda lv, neg: bits(lv),
    "PosterizeIncreasing": lambda lv, neg: 4 - bits(lv),
    "PosterizeOriginal": lambda lv, neg: bits(lv) + 4,
    "Solarize": lambda lv, neg: threshold(lv),
    "SolarizeIncreasing": lambda lv, neg: 256 - threshold(lv),
    "SolarizeAdd": lambda lv, neg: jnp.minimum(128.0, jnp.floor(frac(lv) * 110)),
    "ShearX": lambda lv, neg: _signed(frac(lv) * 0.3, neg),
    "ShearY": lambda lv, neg: _signed(frac(lv) * 0.3, neg),
    "TranslateXRel": lambda lv, neg: _signed(frac(lv) * 0.45, neg) * width,
    "TranslateYRel": lambda lv, neg: _signed(frac(lv) * 0.45, neg) * height,
  }
  for kind in _ENHANCERS:
    args[kind] = lambda lv, neg: frac(lv) * 1.8 + 0.1
    args[kind + "Increasing"] = lambda lv, neg: jnp.maximum(0.1, 1.0 + _signed(frac(lv) * 0.9, neg))
  return args.get(name, lambda lv, neg: jnp.zeros_like(lv))


def paper_argument(
  name: str, bin_index: int | None, width: int, height: int
) -> Callable[[Array, Array], Array]:
  """``(level, negate) -> argument`` of a paper-policy op (torchvision's bins, the host's
  ``PaperOp``); the magnitude is fixed by the bin, only the sign is random."""
  magnitude = (
    0.0 if bin_index is None else autoaugment.paper_magnitude(name, bin_index, width, height)
  )
  signed = name in autoaugment._SIGNED
  value = lambda neg: _signed(jnp.float32(magnitude), neg) if signed else jnp.float32(magnitude)
  if name in ("TranslateX", "TranslateY"):
    return lambda lv, neg: -jnp.trunc(value(neg))  # torchvision moves by int(magnitude) pixels
  if name in _ENHANCERS:
    return lambda lv, neg: 1.0 + value(neg)
  return lambda lv, neg: value(neg)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """An op the sampler can draw: its primitive, probability, (pre-noise) level and argument."""

  primitive: int
  prob: float
  level: float
  argument: Callable[[Array, Array], Array]


@dataclasses.dataclass(frozen=True)
class Plan:
  """What ``sample_ops`` draws from. RandAugment: `ops_per_image` candidates uniformly with
  replacement. AutoAugment (`policy`): one run of `ops_per_image` consecutive candidates (a
  sub-policy), uniformly. Levels get N(0, magnitude_std) noise (uniform in [0, level] when it is
  inf) and are clipped to [0, magnitude_max]."""

  candidates: tuple[Candidate, ...]
  ops_per_image: int
  policy: bool
  magnitude_std: float = 0.0
  magnitude_max: float = autoaugment.LEVEL_DENOM


def _timm_candidate(name: str, prob: float, level: float, width: int, height: int) -> Candidate:
  primitive = autoaugment._TIMM_LEVELS[name][0]
  return Candidate(
    PRIMITIVE_NAMES.index(primitive), prob, float(level), timm_argument(name, width, height)
  )


def build_plan(spec: str, width: int, height: int) -> Plan:
  """The Plan of a data.auto_augment string for (width x height) images (the host's parser and
  policy tables)."""
  kind, parsed = autoaugment._parse(spec)
  if kind == "rand":
    names = (
      autoaugment.RAND_INCREASING_TRANSFORMS if parsed.increasing else autoaugment.RAND_TRANSFORMS
    )
    candidates = tuple(
      _timm_candidate(n, parsed.prob, parsed.magnitude, width, height) for n in names
    )
    return Plan(
      candidates,
      parsed.num_layers,
      policy=False,
      magnitude_std=parsed.magnitude_std,
      magnitude_max=float(parsed.magnitude_max or autoaugment.LEVEL_DENOM),
    )
  if kind == "paper":
    policy = autoaugment.PAPER_POLICIES[parsed]
    candidates = tuple(
      Candidate(PRIMITIVE_NAMES.index(n), p, 0.0, paper_argument(n, b, width, height))
      for sub in policy
      for n, p, b in sub
    )
    return Plan(candidates, len(policy[0]), policy=True)
  name, mstd = parsed
  policy = autoaugment.TIMM_POLICIES[name]
  candidates = tuple(_timm_candidate(n, p, m, width, height) for sub in policy for n, p, m in sub)
  std = math.inf if mstd > 100 else mstd
  return Plan(candidates, len(policy[0]), policy=True, magnitude_std=std)


class OpDraws(NamedTuple):
  """One example's draws, each (ops_per_image,): the primitive index (IDENTITY where the op is
  not applied) and its argument."""

  primitive: Array
  argument: Array


def sample_ops(key: Array, plan: Plan) -> OpDraws:
  """Draws one example's ops, apply flags, magnitudes and signs (see Plan)."""
  k_choice, k_apply, k_noise, k_sign = jax.random.split(key, 4)
  n, candidates = plan.ops_per_image, plan.candidates
  if plan.policy:
    sub_policy = jax.random.randint(k_choice, (), 0, len(candidates) // n)
    index = sub_policy * n + jnp.arange(n)
  else:
    index = jax.random.randint(k_choice, (n,), 0, len(candidates))
  table = lambda field: jnp.asarray([getattr(c, field) for c in candidates])[index]
  apply = jax.random.uniform(k_apply, (n,)) < table("prob")
  level = table("level").astype(jnp.float32)
  if plan.magnitude_std == math.inf:
    level = jax.random.uniform(k_noise, (n,)) * level
  elif plan.magnitude_std > 0:
    level = level + plan.magnitude_std * jax.random.normal(k_noise, (n,))
  level = jnp.clip(level, 0.0, plan.magnitude_max)
  negate = jax.random.bernoulli(k_sign, 0.5, (n,))
  arguments = jnp.stack([jnp.broadcast_to(c.argument(level, negate), (n,)) for c in candidates])
  argument = jnp.take_along_axis(arguments, index[None], axis=0)[0]
  primitive = jnp.where(apply, table("primitive"), IDENTITY)
  return OpDraws(primitive.astype(jnp.int32), argument.astype(jnp.float32))


def apply_ops(image: Array, draws: OpDraws, branches: Sequence[Callable]) -> Array:
  """Applies one example's drawn ops in order to a uint8 (H, W, C) image."""
  levels = image.astype(jnp.float32)
  for j in range(draws.primitive.shape[0]):
    levels = jax.lax.switch(draws.primitive[j], branches, levels, draws.argument[j])
  return levels.astype(jnp.uint8)


def _apply_layer_grouped(
  levels: Array, primitive: Array, argument: Array, branches: Sequence[Callable], group_size: int
) -> Array:
  """One op per example (`primitive`, `argument`: (B,)) on float32 levels (B, H, W, C), grouped
  by op: the examples sorted by op, each op's run cut into groups of `group_size`, one group per
  loop iteration through a ``lax.switch`` on the group's op, so only that op runs (vmapped over
  the group). Identity examples are skipped; a group's spare lanes recompute one of its examples
  and their writes are dropped."""
  b, num_ops = primitive.shape[0], len(branches) - 1
  counts = jnp.bincount(primitive, length=num_ops + 1)[:num_ops]
  groups = -(-counts // group_size)
  groups_end = jnp.cumsum(groups)
  run_start = jnp.cumsum(counts) - counts  # where each op's examples start in `order`
  order = jnp.argsort(primitive, stable=True)
  lanes = jnp.arange(group_size)
  batched = [jax.vmap(branch) for branch in branches[:num_ops]]

  def group(i: Array, levels: Array) -> Array:
    op = jnp.searchsorted(groups_end, i, side="right")
    offset = (i - (groups_end[op] - groups[op])) * group_size + lanes
    index = order[jnp.minimum(run_start[op] + offset, b - 1)]
    out = jax.lax.switch(op, batched, levels[index], argument[index])
    return levels.at[jnp.where(offset < counts[op], index, b)].set(out, mode="drop")

  return jax.lax.fori_loop(0, groups_end[-1], group, levels)


def apply_ops_grouped(images: Array, draws: OpDraws, branches: Sequence[Callable], group_size: int):
  """``apply_ops`` on a uint8 (B, H, W, C) batch with draws (B, ops_per_image), each op slot
  grouped by op (``_apply_layer_grouped``): every example computes its drawn ops only."""
  levels = images.astype(jnp.float32)
  for j in range(draws.primitive.shape[1]):
    levels = _apply_layer_grouped(
      levels, draws.primitive[:, j], draws.argument[:, j], branches, group_size
    )
  return levels.astype(jnp.uint8)


# On an accelerator, up to this many pixels per image the per-example vmap (every op on every
# example, then a select) is one parallel pass that costs little; above it the select computes 15
# ops per example where one is drawn, and grouping by op wins (docs/benchmarks.md).
SELECT_MAX_PIXELS = 64 * 64


def dispatch(height: int, width: int, platform: str) -> str:
  """How ``auto_augment`` applies the drawn ops to (height x width) images on `platform`:
  'select' (vmap over examples; ``lax.switch`` becomes a select over all ops) or 'grouped'
  (``apply_ops_grouped``). On CPU grouping is faster at every size (docs/benchmarks.md)."""
  small = height * width <= SELECT_MAX_PIXELS
  return "select" if small and platform != "cpu" else "grouped"


def group_size(batch: int) -> int:
  """Examples per group: in an op slot a batch spreads over 15 ops and about half its examples
  skip the slot (p = 0.5 in the recipes' RandAugment), so about batch / 30 meet per op; groups of
  that size leave few idle lanes."""
  return -(-batch // 32)


def auto_augment(
  key: Array,
  images: Array,
  data_config: Any,
  *,
  platform: str | None = None,
  how: str | None = None,
) -> Array:
  """data.auto_augment on a uint8 (B, H, W, C) batch, each example with its own key from `key`;
  the batch unchanged when data.auto_augment is None. ``how``: 'select' or 'grouped'; without
  it, ``dispatch`` by image size and ``platform`` (the backend the step is compiled for, which
  the caller passes); both give the same pixels, bit for bit."""
  spec = data_config.auto_augment
  if spec is None:
    return images
  b, height, width, channels = images.shape
  plan = build_plan(spec, width, height)
  fill = _fill_levels(channels, autoaugment.fill_from_data_config(data_config))
  branches = primitive_branches(fill, data_config.interpolation)
  draws = jax.vmap(lambda k: sample_ops(k, plan))(jax.random.split(key, b))
  if how is None and platform is None:
    raise ValueError(
      "auto_augment needs the platform it is compiled for, or how='select' or 'grouped'"
    )
  if (how or dispatch(height, width, platform)) == "grouped":
    return apply_ops_grouped(images, draws, branches, group_size(b))
  return jax.vmap(lambda image, d: apply_ops(image, d, branches))(images, draws)
