"""RandAugment / AutoAugment on the device (data.augment_on='device'): each op against the host
Pillow op, the op/magnitude draws against the host's distribution, determinism and lowering."""

import math
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from locvit.data import autoaugment, default_data_config
from locvit.data import device_augment as da
from locvit.data import device_autoaugment as dev

FILL = (124, 116, 104)  # round(255 * ImageNet mean)


def natural_image(seed, size=32, channels=3):
  """Smooth colour gradients plus noise and one flat patch: the level statistics of a photo."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:size, 0:size] / (size - 1)
  planes = [200 * x + 30, 180 * y + 40, 60 * (x + y) + 60 * np.sin(6 * x)]
  image = np.stack(planes[:channels], -1) + rng.normal(0, 12, (size, size, channels))
  image[8:14, 10:20] = rng.integers(0, 256, channels)
  return np.clip(np.round(image), 0, 255).astype(np.uint8)


IMAGES = [natural_image(0), natural_image(1), natural_image(2, channels=1)]
IMAGES.append(np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8))

_apply = jax.jit(dev.apply_primitive, static_argnames=("name", "fill", "interpolation"))


def differences(name, args, interpolation="bicubic", images=IMAGES):
  """|device - host| over images x args, as one flat int array."""
  out = []
  for image in images:
    for arg in args:
      host = autoaugment.apply_op(image, name, arg, fill=FILL, interpolation=interpolation)
      device_arg = np.float32(0.0 if arg is None else arg)  # one dtype: one compilation
      got = _apply(jnp.asarray(image), name, device_arg, fill=FILL, interpolation=interpolation)
      out.append(np.abs(host.astype(int) - np.asarray(got).astype(int)).ravel())
  return np.concatenate(out)


# Exact: integer LUTs and Pillow's float32 blend reproduced step for step. Within 1: AutoContrast
# (the host's float64 int(x * scale + offset) falls just below an exact integer on some levels;
# the device takes the exact floor), Color (float32 blend rounding; measured on < 0.1% of pixels).
PHOTOMETRIC = [
  ("Equalize", [None], 0),
  ("Invert", [None], 0),
  ("Posterize", [0, 1, 2, 4, 7, 8], 0),
  ("Solarize", [0, 26, 128, 230, 255 * (1 - 2 / 9), 256], 0),
  ("SolarizeAdd", [0, 33, 110], 0),
  ("Contrast", [0.1, 0.55, 1.37, 1.9], 0),
  ("Brightness", [0.1, 0.55, 1.37, 1.9], 0),
  ("Sharpness", [0.1, 0.55, 1.37, 1.9], 0),
  ("AutoContrast", [None], 1),
  ("Color", [0.1, 0.55, 1.37, 1.9], 1),
]


@pytest.mark.parametrize("name,args,tolerance", PHOTOMETRIC, ids=[p[0] for p in PHOTOMETRIC])
def test_photometric_ops_match_pillow(name, args, tolerance):
  assert differences(name, args).max() <= tolerance


def test_equalize_is_exact_on_few_level_and_flat_images():
  """Pillow's step rule on the corner cases: one level, two levels, a few dominant levels."""
  rng = np.random.default_rng(0)
  cases = [
    np.full((16, 16, 3), 77, np.uint8),
    rng.choice(np.array([3, 250], np.uint8), (16, 16, 3)),
    rng.choice(np.array([0, 9, 10, 200, 255], np.uint8), (16, 16, 3), p=[0.5, 0.2, 0.1, 0.1, 0.1]),
    rng.integers(100, 140, (16, 16, 1), dtype=np.uint8),
  ]
  for image in cases:
    host = autoaugment.apply_op(image, "Equalize")
    np.testing.assert_array_equal(np.asarray(_apply(jnp.asarray(image), "Equalize")), host)


# Measured on IMAGES with these arguments (float32 sampling vs Pillow's float64; the fill and
# the sample-point test agree everywhere): every pixel within 1 grey level; mean |diff| at most
# 0.004 (bicubic) and 0.09 (bilinear, dm-pix's weight products vs Pillow's nested lerps).
GEOMETRIC_ARGS = {
  "Rotate": [-30, -13.7, 3, 9, 30],
  "ShearX": [-0.3, -0.13, 0.07, 0.3],
  "ShearY": [-0.3, 0.17, 0.3],
  "TranslateX": [-14.4, -3, 5, 7.3, 14],
  "TranslateY": [-14, 2.5, 9],
}


@pytest.mark.parametrize(
  "interpolation,names,mean_bound",
  # Bilinear: the two worst ops only (one sampler; each op only changes the coordinate map).
  [("bicubic", tuple(GEOMETRIC_ARGS), 0.01), ("bilinear", ("Rotate", "TranslateX"), 0.1)],
)
def test_geometric_ops_match_pillow_within_one_level(interpolation, names, mean_bound):
  for name in names:
    # RGB only: each channel count compiles the sampler again; the 1-channel path is the same code.
    rgb = [image for image in IMAGES if image.shape[-1] == 3]
    diff = differences(name, GEOMETRIC_ARGS[name], interpolation, rgb)
    assert diff.max() <= 1, name
    assert diff.mean() <= mean_bound, (name, diff.mean())


class FixedSign:
  """Host rng stand-in whose sign draws (random() > 0.5 negates) are fixed."""

  def __init__(self, negate):
    self.negate = negate

  def random(self):
    return 1.0 if self.negate else 0.0


class Size:
  size = (32, 24)


def test_timm_level_mapping_matches_the_host():
  levels = np.concatenate([np.arange(0, 30.5, 0.5), [0.37, 2.51, 7.77, 9.99]]).astype(np.float32)
  for name, (_, level_fn) in autoaugment._TIMM_LEVELS.items():
    if level_fn is None:
      continue
    for negate in (False, True):
      argument = dev.timm_argument(name, *Size.size)
      got = np.asarray(argument(jnp.asarray(levels), jnp.full(levels.shape, negate)))
      want = [level_fn(float(lv), FixedSign(negate), Size) for lv in levels]
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5, err_msg=name)


def host_draws(spec, n, size=(32, 32), monkeypatch=None):
  """The host transform's applied (primitive, argument) per example, with the image ops stubbed
  out (only the sampling runs)."""
  recorded = []
  for name in autoaugment.PRIMITIVES:

    def record(img, arg, ctx, name=name):
      recorded[-1].append((name, round(0.0 if arg is None else float(arg), 4)))
      return img

    monkeypatch.setitem(autoaugment.PRIMITIVES, name, record)
  transform = autoaugment.build(spec)

  class Image:
    pass

  image = Image()
  image.size = size
  rng = np.random.default_rng(0)
  for _ in range(n):
    recorded.append([])
    transform._apply(image, rng, None)
  return recorded


def device_draws(spec, n, size=(32, 32)):
  plan = dev.build_plan(spec, *size)
  keys = jax.random.split(jax.random.key(0), n)
  draws = jax.jit(jax.vmap(lambda k: dev.sample_ops(k, plan)))(keys)
  primitive, argument = np.asarray(draws.primitive), np.asarray(draws.argument)
  return [
    [(dev.PRIMITIVE_NAMES[p], round(float(a), 4)) for p, a in zip(ps, args) if p != dev.IDENTITY]
    for ps, args in zip(primitive, argument)
  ]


@pytest.mark.parametrize("spec", ["rand-m9-mstd0.5-inc1", "autoaug-cifar10", "original-mstd0.5"])
def test_op_choices_and_magnitudes_follow_the_host_distribution(spec, monkeypatch):
  """4096 examples: per-op frequencies within 5 sigma, the number of applied ops per example
  within 5 sigma, and each op's argument distribution indistinguishable by a two-sample KS test
  (arguments rounded to 4 decimals: float32 on the device, float64 on the host)."""
  n = 4096
  host, device = host_draws(spec, n, monkeypatch=monkeypatch), device_draws(spec, n)
  ops_per_image = dev.build_plan(spec, 32, 32).ops_per_image
  slots = n * ops_per_image
  host_ops = Counter(name for ex in host for name, _ in ex)
  device_ops = Counter(name for ex in device for name, _ in ex)
  for name in set(host_ops) | set(device_ops):
    p = (host_ops[name] + device_ops[name]) / (2 * slots)
    # Slots of one example are correlated (a sub-policy): bound the variance by ops_per_image.
    sigma = math.sqrt(2 * slots * p * (1 - p) * ops_per_image) + 1
    assert abs(host_ops[name] - device_ops[name]) < 5 * sigma, (name, host_ops, device_ops)
    host_args = [a for ex in host for nm, a in ex if nm == name]
    device_args = [a for ex in device for nm, a in ex if nm == name]
    if min(len(host_args), len(device_args)) > 20:
      assert stats.ks_2samp(host_args, device_args).pvalue > 1e-4, name
  for k in range(ops_per_image + 1):
    h, d = (sum(len(ex) == k for ex in draws) for draws in (host, device))
    p = (h + d) / (2 * n)
    assert abs(h - d) < 5 * math.sqrt(2 * n * p * (1 - p)) + 1, (k, h, d)


def data_cfg(**fields):
  c = default_data_config()
  c.update(fields)
  return c


def test_device_auto_augment_is_per_example_and_follows_the_key():
  """recipe_ops applies it (here the only op that moves); the same key gives the same batch (exact
  resume), another key another one, and each example draws its own ops."""
  spec = "rand-m9-n1-mstd0.5-inc1"  # one op per image: half the op table to compile
  cfg = data_cfg(train_augment="none", augment_on="device", auto_augment=spec, image_size=16)
  batch = jnp.broadcast_to(jnp.asarray(IMAGES[0][:16, :16]), (16, 16, 16, 3))
  run = jax.jit(lambda k, x: da.recipe_ops(k, {"image": x}, cfg, platform="cpu"))
  out = np.asarray(run(jax.random.key(0), batch))
  assert out.shape == batch.shape and out.dtype == np.uint8
  assert len({o.tobytes() for o in out}) > 6  # 15 ops at p = 0.5, per example
  np.testing.assert_array_equal(out, run(jax.random.key(0), batch))
  assert not np.array_equal(out, run(jax.random.key(1), batch))
  off = data_cfg(train_augment="crop_flip", augment_on="device")
  assert dev.auto_augment(jax.random.key(0), batch, off) is batch


def per_example_select(key, images, cfg):
  """The device op before grouping: a vmap over examples, where ``lax.switch`` on the drawn op
  becomes a select over every op."""
  height, width, channels = images.shape[1:]
  plan = dev.build_plan(cfg.auto_augment, width, height)
  fill = dev._fill_levels(channels, autoaugment.fill_from_data_config(cfg))
  branches = dev.primitive_branches(fill, cfg.interpolation)
  augment_one = lambda k, image: dev.apply_ops(image, dev.sample_ops(k, plan), branches)
  return jax.vmap(augment_one)(jax.random.split(key, images.shape[0]), images)


@pytest.mark.parametrize(
  "spec,interpolation,channels",
  [("rand-m9-n3-mstd0.5-inc1", "bicubic", 3), ("original-mstd101", "bilinear", 1)],
)
def test_grouped_ops_equal_the_per_example_select_bit_for_bit(spec, interpolation, channels):
  """Grouping examples by drawn op (each example computes only its ops) gives the pixels of the
  per-example select, same keys; 40 examples, 3 or 2 ops each, groups of 2: full groups,
  part-filled groups and ops no example drew."""
  cfg = data_cfg(auto_augment=spec, interpolation=interpolation, image_size=16)
  images = np.random.default_rng(0).integers(0, 256, (40, 16, 16, channels), dtype=np.uint8)
  images[:5] = IMAGES[2 if channels == 1 else 0][:16, :16]
  key = jax.random.key(7)
  before = jax.jit(lambda k, x: per_example_select(k, x, cfg))(key, images)
  grouped = jax.jit(lambda k, x: dev.auto_augment(k, x, cfg, how="grouped"))(key, images)
  np.testing.assert_array_equal(grouped, before)


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_device_auto_augment_lowers_for_accelerators_without_host_callbacks(platform):
  """Crop, flip, RandAugment (every op of the table) and normalisation as one device program."""
  cfg = data_cfg(
    train_augment="crop_flip", augment_on="device", image_size=16, auto_augment="rand-m9-n2"
  )
  backend = {"cuda": "gpu"}.get(platform, platform)  # the backend the step is compiled for

  def step(key, images):
    return da.normalize(da.recipe_ops(key, {"image": images}, cfg, platform=backend), cfg)

  images = jnp.zeros((4, 16, 16, 3), jnp.uint8)
  text = jax.jit(step).trace(jax.random.key(0), images).lower(lowering_platforms=(platform,))
  text = text.as_text()
  assert "stablehlo.scatter" in text  # the equalize histogram: the op table is in the program
  assert "custom_call" not in text and "callback" not in text.lower()
