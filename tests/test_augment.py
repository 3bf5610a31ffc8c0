"""Tests for locvit.data.autoaugment (RandAugment / AutoAugment) and the host-side recipe ops.

Reference outputs are computed here with NumPy from the ops' definitions (timm's level mapping,
torchvision's AutoAugment bins, PIL's point-op formulas). Runtime: a few seconds.
"""

import math

import numpy as np
import pytest

from locvit import data as D
from locvit.data import augment as A
from locvit.data import autoaugment as AA

GRAY = (128, 128, 128)


def _image(h=32, w=32, c=3, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def _cfg(**overrides):
  cfg = D.default_data_config()
  for k, v in overrides.items():
    cfg[k] = v
  return cfg


def _sign(seed: int) -> float:
  """The sign timm's _randomly_negate draws first from default_rng(seed)."""
  return -1.0 if np.random.default_rng(seed).random() > 0.5 else 1.0


# ----------------------------------------------------------------------------- every timm op


@pytest.mark.parametrize("name", sorted(AA._TIMM_LEVELS))
@pytest.mark.parametrize("channels", [1, 3])
def test_timm_op_shape_dtype_determinism(name, channels):
  image = _image(20, 28, channels)
  for magnitude in (0, 3, 9, 10):
    a = AA.augment_op(image, name, magnitude, np.random.default_rng(7))
    b = AA.augment_op(image, name, magnitude, np.random.default_rng(7))
    assert a.shape == image.shape and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)


IDENTITY_AT_ZERO = [
  "Rotate",
  "ShearX",
  "ShearY",
  "TranslateXRel",
  "TranslateYRel",
  "ColorIncreasing",
  "ContrastIncreasing",
  "BrightnessIncreasing",
  "SharpnessIncreasing",
  "SolarizeIncreasing",
  "SolarizeAdd",
]


@pytest.mark.parametrize("name", IDENTITY_AT_ZERO)
@pytest.mark.parametrize("channels", [1, 3])
def test_identity_at_magnitude_zero(name, channels):
  image = _image(c=channels)
  for seed in range(4):  # Both signs.
    np.testing.assert_array_equal(
      AA.augment_op(image, name, 0, np.random.default_rng(seed), interpolation="bicubic"), image
    )


def test_non_identity_ops_at_magnitude_zero():
  image = _image()
  rng = np.random.default_rng(0)
  # Solarize threshold 0 inverts everything; Posterize keeps 0 bits (black); the
  # non-"Increasing" enhance ops use factor 0.1 at level 0.
  np.testing.assert_array_equal(AA.augment_op(image, "Solarize", 0, rng), 255 - image)
  np.testing.assert_array_equal(AA.augment_op(image, "Posterize", 0, rng), np.zeros_like(image))
  np.testing.assert_array_equal(
    AA.augment_op(image, "Brightness", 0, rng), AA.apply_op(image, "Brightness", 0.1)
  )
  # Level 5 of the non-increasing enhance ops is factor 1.0: the identity.
  np.testing.assert_array_equal(AA.augment_op(image, "Contrast", 5, rng), image)
  # PosterizeOriginal keeps 4 + int(4 m / 10) bits: 8 (identity) at m = 10.
  np.testing.assert_array_equal(AA.augment_op(image, "PosterizeOriginal", 10, rng), image)


# ----------------------------------------------------------------------------- exact outputs


def test_invert_exact():
  image = _image(3, 4)
  np.testing.assert_array_equal(AA.apply_op(image, "Invert"), 255 - image)
  np.testing.assert_array_equal(
    AA.augment_op(image[..., :1], "Invert", 5, None), 255 - image[..., :1]
  )


@pytest.mark.parametrize("threshold", [0, 1, 77, 128, 255, 256])
def test_solarize_threshold_exact(threshold):
  image = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
  expected = np.where(image >= threshold, 255 - image, image)
  np.testing.assert_array_equal(AA.apply_op(image, "Solarize", threshold), expected)


def test_solarize_levels():
  image = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
  rng = np.random.default_rng(0)
  # timm: threshold int(m / 10 * 256); increasing: 256 minus that.
  for m, thresh in [(5, 128), (9, 230), (10, 256)]:
    np.testing.assert_array_equal(
      AA.augment_op(image, "Solarize", m, rng), np.where(image >= thresh, 255 - image, image)
    )
    inc = 256 - thresh
    np.testing.assert_array_equal(
      AA.augment_op(image, "SolarizeIncreasing", m, rng), np.where(image >= inc, 255 - image, image)
    )


def test_solarize_add_exact():
  image = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
  add = int(0.3 * 110)  # timm level 3 -> 33, added below 128.
  expected = np.where(image < 128, np.minimum(image.astype(int) + add, 255), image)
  np.testing.assert_array_equal(AA.augment_op(image, "SolarizeAdd", 3, None), expected)


@pytest.mark.parametrize(
  ("name", "magnitude", "bits"),
  [
    ("Posterize", 9, 3),  # int(0.9 * 4)
    ("Posterize", 2, 0),
    ("PosterizeIncreasing", 9, 1),  # 4 - 3
    ("PosterizeIncreasing", 0, 4),
    ("PosterizeOriginal", 8, 7),  # int(0.8 * 4) + 4
  ],
)
def test_posterize_bits_exact(name, magnitude, bits):
  image = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
  mask = (0xFF << (8 - bits)) & 0xFF
  np.testing.assert_array_equal(AA.augment_op(image, name, magnitude, None), image & mask)


def _equalize_reference(channel: np.ndarray) -> np.ndarray:
  """PIL's equalize: LUT (step // 2 + pixels below i) // step, step from the histogram."""
  h = np.bincount(channel.ravel(), minlength=256)
  nonzero = h[h > 0]
  step = (nonzero.sum() - nonzero[-1]) // 255 if len(nonzero) > 1 else 0
  if step == 0:
    return channel
  below = np.concatenate([[0], np.cumsum(h)[:-1]])
  lut = np.minimum((step // 2 + below) // step, 255)
  return lut[channel].astype(np.uint8)


def test_equalize_exact():
  rng = np.random.default_rng(3)
  image = np.stack(
    [
      rng.choice([10, 50, 51, 200], size=(16, 20), p=[0.5, 0.2, 0.2, 0.1]),
      rng.integers(100, 140, size=(16, 20)),
      np.full((16, 20), 9),  # A constant channel is left as is.
    ],
    axis=-1,
  ).astype(np.uint8)
  expected = np.stack([_equalize_reference(image[..., c]) for c in range(3)], axis=-1)
  assert not np.array_equal(expected[..., 0], image[..., 0])
  np.testing.assert_array_equal(AA.apply_op(image, "Equalize"), expected)
  np.testing.assert_array_equal(AA.apply_op(image[..., :1], "Equalize"), expected[..., :1])


def _autocontrast_reference(channel: np.ndarray) -> np.ndarray:
  lo, hi = int(channel.min()), int(channel.max())
  if hi <= lo:
    return channel
  scale = 255.0 / (hi - lo)
  lut = np.clip(np.trunc(np.arange(256) * scale + (-lo * scale)), 0, 255)
  return lut[channel].astype(np.uint8)


def test_autocontrast_exact():
  image = np.array(
    [[[10, 0, 7], [20, 255, 7]], [[30, 128, 7], [40, 64, 7]]], dtype=np.uint8
  )  # Channel 2 constant: unchanged.
  expected = np.stack([_autocontrast_reference(image[..., c]) for c in range(3)], axis=-1)
  np.testing.assert_array_equal(expected[..., 0], [[0, 85], [170, 255]])
  np.testing.assert_array_equal(AA.apply_op(image, "AutoContrast"), expected)


def test_enhance_extremes():
  image = _image()
  np.testing.assert_array_equal(AA.apply_op(image, "Brightness", 0.0), np.zeros_like(image))
  gray = AA.apply_op(image, "Color", 0.0)  # Fully desaturated: equal channels.
  np.testing.assert_array_equal(gray[..., 0], gray[..., 1])
  np.testing.assert_array_equal(gray[..., 0], gray[..., 2])
  assert len(np.unique(AA.apply_op(image, "Contrast", 0.0))) == 1  # One flat gray.
  one = image[..., :1]
  np.testing.assert_array_equal(AA.apply_op(one, "Color", 0.3), one)  # No colour to remove.


def test_geometric_ops_exact_and_fill():
  image = _image(16, 16)
  fill = (11, 22, 33)
  # Integer translation is exact; the uncovered band takes the fill.
  out = AA.apply_op(image, "TranslateX", 5, fill=fill)
  np.testing.assert_array_equal(out[:, :11], image[:, 5:])
  assert np.all(out[:, 11:] == fill)
  out = AA.apply_op(image, "TranslateY", -3, fill=fill, interpolation="bicubic")
  np.testing.assert_array_equal(out[3:], image[:13])
  assert np.all(out[:3] == fill)
  for interp in ("bilinear", "bicubic"):
    np.testing.assert_array_equal(
      AA.apply_op(image, "Rotate", 90, interpolation=interp), np.rot90(image)
    )
  sheared = AA.apply_op(image, "ShearX", 0.3, fill=fill)  # Samples x + 0.3 y: past the edge.
  assert tuple(sheared[-1, -1]) == fill and tuple(sheared[0, 0]) != fill
  gray = AA.apply_op(image[..., :1], "ShearY", 0.3, fill=fill)
  assert gray.shape == (16, 16, 1) and gray[-1, -1, 0] == 22  # Channel mean of the fill.


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_timm_signed_levels(seed):
  """Rotate m -> +-30 m / 10 deg, Shear +-0.3 m / 10, Translate +-0.45 m / 10 of the size."""
  image = _image(20, 30)
  sign = _sign(seed)
  cases = [  # Arithmetic in timm's order: (m / 10) * range, then the sign, then the size.
    ("Rotate", 10, "Rotate", 30.0 * sign),
    ("ShearX", 5, "ShearX", 0.5 * 0.3 * sign),
    ("ShearY", 10, "ShearY", 0.3 * sign),
    ("TranslateXRel", 10, "TranslateX", 0.45 * sign * 30),
    ("TranslateYRel", 4, "TranslateY", 0.4 * 0.45 * sign * 20),
    ("ColorIncreasing", 10, "Color", 1.0 + 0.9 * sign),
    ("SharpnessIncreasing", 5, "Sharpness", 1.0 + 0.5 * 0.9 * sign),
  ]
  for name, magnitude, primitive, arg in cases:
    got = AA.augment_op(image, name, magnitude, np.random.default_rng(seed), fill=GRAY)
    np.testing.assert_array_equal(got, AA.apply_op(image, primitive, arg, fill=GRAY), name)


def test_augment_op_probability_and_magnitude_noise():
  image = _image()
  ctx = AA._context(3, GRAY, "bilinear")
  op = AA.AugmentOp("Rotate", prob=0.5, magnitude=9, magnitude_std=0.5)
  applied = 0
  for seed in range(40):
    r = np.random.default_rng(seed)  # timm's draw order: apply?, magnitude noise, sign.
    if r.random() > 0.5:
      expected = image
    else:
      applied += 1
      magnitude = min(max(r.normal(9, 0.5), 0.0), 10.0)
      degrees = magnitude / 10 * 30 * (-1 if r.random() > 0.5 else 1)
      expected = AA.apply_op(image, "Rotate", degrees)
    got = A.from_pil(op(A.to_pil(image), np.random.default_rng(seed), ctx), 3)
    np.testing.assert_array_equal(got, expected)
  assert 10 < applied < 30
  # Uniform noise in [0, m] (mstd > 100) and the mmax clip.
  uniform = AA.AugmentOp("Rotate", 1.0, 8, magnitude_std=math.inf)
  r = np.random.default_rng(5)
  degrees = r.uniform(0, 8) / 10 * 30 * (-1 if r.random() > 0.5 else 1)
  got = A.from_pil(uniform(A.to_pil(image), np.random.default_rng(5), ctx), 3)
  np.testing.assert_array_equal(got, AA.apply_op(image, "Rotate", degrees))
  clipped = AA.AugmentOp("Rotate", 1.0, 20, magnitude_max=None)  # Clipped to 10 -> 30 deg.
  got = A.from_pil(clipped(A.to_pil(image), np.random.default_rng(0), ctx), 3)
  np.testing.assert_array_equal(got, AA.apply_op(image, "Rotate", 30 * _sign(0)))


def test_bad_channels_and_unknown_op():
  with pytest.raises(ValueError, match="1- or 3-channel images, got 4 channels"):
    AA.build("rand-m9")(_image(8, 8, 4), np.random.default_rng(0))
  with pytest.raises(ValueError, match="unknown augmentation op 'Blur'"):
    AA.apply_op(_image(), "Blur")
  with pytest.raises(ValueError, match="unknown timm augmentation op 'Cutout'"):
    AA.AugmentOp("Cutout")


# ----------------------------------------------------------------------------- RandAugment


def test_parse_rand_augment():
  assert AA.parse_rand_augment("rand-m9-mstd0.5-inc1") == AA.RandAugmentConfig(
    magnitude=9, num_layers=2, prob=0.5, magnitude_std=0.5, magnitude_max=None, increasing=True
  )
  assert AA.parse_rand_augment("rand") == AA.RandAugmentConfig()
  assert AA.parse_rand_augment("rand-n3-p1.0-mmax20-m15-inc0") == AA.RandAugmentConfig(
    magnitude=15, num_layers=3, prob=1.0, magnitude_max=20
  )
  assert AA.parse_rand_augment("rand-mstd101").magnitude_std == math.inf


def test_rand_augment_op_set():
  ra = AA.build("rand-m9-mstd0.5-inc1", fill=(1, 2, 3), interpolation="bicubic")
  assert isinstance(ra, AA.RandAugment) and ra.num_layers == 2
  assert [op.name for op in ra.ops] == list(AA.RAND_INCREASING_TRANSFORMS)
  assert len(ra.ops) == 15
  assert all((op.prob, op.magnitude, op.magnitude_std) == (0.5, 9, 0.5) for op in ra.ops)
  plain = AA.build("rand-m7-n4-p0.8")
  assert [op.name for op in plain.ops] == list(AA.RAND_TRANSFORMS) and plain.num_layers == 4
  assert "TranslateXRel" in AA.RAND_TRANSFORMS and "PosterizeIncreasing" not in AA.RAND_TRANSFORMS


def test_rand_augment_composition_and_determinism():
  image = _image(24, 24)
  ra = AA.build("rand-m9-mstd0.5-inc1", fill=GRAY)
  ctx = AA._context(3, GRAY, "bilinear")
  outs = []
  for seed in range(12):
    got = ra(image, np.random.default_rng(seed))
    np.testing.assert_array_equal(got, ra(image, np.random.default_rng(seed)))
    r = np.random.default_rng(seed)  # n op indices with replacement first, then each op.
    img = A.to_pil(image)
    for i in r.integers(0, 15, size=2):
      img = ra.ops[i](img, r, ctx)
    np.testing.assert_array_equal(got, A.from_pil(img, 3))
    outs.append(got.tobytes())
  assert len(set(outs)) > 8


@pytest.mark.parametrize(
  ("spec", "message"),
  [
    ("rand-m11", "magnitude m=11 must be in [0, 10] (raise the bound with mmax, up to 30)"),
    ("rand-m25-mmax20", "magnitude m=25 must be in [0, 20]"),
    ("rand-m9-mmax31", "mmax=31 must be in [1, 30]"),
    (
      "rand-m9-w0",
      "unknown section 'w0'; valid sections are ['inc', 'm', 'mmax', 'mstd', 'n', 'p']",
    ),
    ("rand-m9-foo", "unknown section 'foo'"),
    ("rand-m9.5", "m9.5 needs an integer"),
    ("rand-n0", "n=0 ops per image must be >= 1"),
    ("rand-p1.5", "p=1.5 must be a probability in [0, 1]"),
    ("rand-inc2", "inc=2 must be 0 or 1"),
    ("rand-m9-m8", "section 'm' given twice"),
    ("original-m9", "unknown section 'm9'; valid sections are ['mstd']"),
  ],
)
def test_auto_augment_errors(spec, message):
  with pytest.raises(ValueError) as e:
    D.validate_data_config(_cfg(auto_augment=spec))
  assert f"data.auto_augment={spec!r}" in str(e.value) and message in str(e.value)


@pytest.mark.parametrize("spec", ["randaugment", "autoaug-cifar100", "autoaug", "AutoAugment", ""])
def test_unknown_policy_lists_valid_names(spec):
  with pytest.raises(ValueError) as e:
    D.validate_data_config(_cfg(auto_augment=spec))
  for name in ("autoaug-cifar10", "autoaug-svhn", "autoaug-imagenet", "original", "v0", "rand-"):
    assert name in str(e.value)


# ----------------------------------------------------------------------------- AutoAugment


def test_policy_tables():
  for name in ("cifar10", "svhn", "imagenet"):
    policy = AA.PAPER_POLICIES[name]
    assert len(policy) == 25 and all(len(sub) == 2 for sub in policy)
    for op, prob, bin_index in (op for sub in policy for op in sub):
      assert op in AA.PRIMITIVES and 0.0 <= prob <= 1.0
      no_magnitude = op in ("AutoContrast", "Equalize", "Invert")
      assert (bin_index is None) == no_magnitude and (no_magnitude or 0 <= bin_index <= 9)
  for name in ("original", "originalr", "v0", "v0r"):
    assert len(AA.TIMM_POLICIES[name]) == 25
    assert all(op in AA._TIMM_LEVELS for sub in AA.TIMM_POLICIES[name] for op, _, _ in sub)
  # The paper's first sub-policies, and timm's posterize variant of the ImageNet policy.
  assert AA.PAPER_POLICIES["cifar10"][0] == (("Invert", 0.1, None), ("Contrast", 0.2, 6))
  assert AA.PAPER_POLICIES["svhn"][0] == (("ShearX", 0.9, 4), ("Invert", 0.2, None))
  assert AA.TIMM_POLICIES["original"][0] == (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9))
  assert AA.TIMM_POLICIES["v0"][0] == (("Equalize", 0.8, 1), ("ShearY", 0.8, 4))


def test_paper_magnitude_bins():
  posterize = [AA.paper_magnitude("Posterize", b, 32, 32) for b in range(10)]
  assert posterize == [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]
  np.testing.assert_allclose(
    [AA.paper_magnitude("Solarize", b, 32, 32) for b in range(10)], np.linspace(255, 0, 10)
  )
  np.testing.assert_allclose(
    [AA.paper_magnitude("TranslateY", b, 32, 40) for b in range(10)],
    np.linspace(0, 150 / 331 * 40, 10),
  )
  assert AA.paper_magnitude("Rotate", 9, 1, 1) == 30.0
  assert AA.paper_magnitude("Color", 9, 1, 1) == pytest.approx(0.9)


@pytest.mark.parametrize("seed", range(4))
def test_paper_ops_exact(seed):
  image = _image(32, 32)
  ctx = AA._context(3, GRAY, "bilinear")

  def run(op):
    return A.from_pil(op(A.to_pil(image), np.random.default_rng(seed), ctx), 3)

  r = np.random.default_rng(seed)
  r.random()  # apply draw (prob 1)
  negative = r.integers(0, 2) == 0
  # TranslateX bin 9: int(150 / 331 * 32) = 14 px; torchvision moves right unless the sign is 0.
  shifted = run(AA.PaperOp("TranslateX", 1.0, 9))
  if negative:
    np.testing.assert_array_equal(shifted[:, :18], image[:, 14:])
  else:
    np.testing.assert_array_equal(shifted[:, 14:], image[:, :18])
  brightness = run(AA.PaperOp("Brightness", 1.0, 9))  # Factor 1 -+ 0.9.
  np.testing.assert_array_equal(
    brightness, AA.apply_op(image, "Brightness", 0.1 if negative else 1.9)
  )
  np.testing.assert_array_equal(run(AA.PaperOp("Posterize", 1.0, 9)), image & 0xF0)
  np.testing.assert_array_equal(run(AA.PaperOp("Solarize", 1.0, 9)), 255 - image)
  np.testing.assert_array_equal(run(AA.PaperOp("Invert", 0.0, None)), image)  # Never applied.


def test_auto_augment_draws_one_sub_policy():
  image = _image(8, 8)
  policy = [[AA.PaperOp("Invert", 1.0, None)], [AA.PaperOp("Posterize", 1.0, 0)]]  # 8 bits: id
  aa = AA.AutoAugment(policy)
  outs = [aa(image, np.random.default_rng(s)) for s in range(40)]
  inverted = [np.array_equal(o, 255 - image) for o in outs]
  assert all(inv or np.array_equal(o, image) for inv, o in zip(inverted, outs))
  assert 10 < sum(inverted) < 30
  for s in range(5):
    expected_inverted = np.random.default_rng(s).integers(0, 2) == 0
    assert inverted[s] == expected_inverted


@pytest.mark.parametrize(
  "spec", ["autoaug-cifar10", "autoaug-svhn", "autoaug-imagenet", "v0-mstd0.5"]
)
@pytest.mark.parametrize("channels", [1, 3])
def test_auto_augment_policies_run(spec, channels):
  image = _image(32, 32, channels)
  aa = AA.build(spec, fill=GRAY, interpolation="bicubic")
  outs = [aa(image, np.random.default_rng(s)) for s in range(30)]
  assert all(o.shape == image.shape and o.dtype == np.uint8 for o in outs)
  np.testing.assert_array_equal(outs[3], aa(image, np.random.default_rng(3)))
  assert len({o.tobytes() for o in outs}) > 10


# ----------------------------------------------------------------------------- data config


def test_train_transform_appends_auto_augment_after_recipe():
  cfg = _cfg(image_size=24, train_augment="rrc_flip", auto_augment="rand-m9-mstd0.5-inc1")
  assert A.train_op_names(cfg) == ("random_resized_crop", "hflip", "auto_augment")
  assert A.train_op_names(_cfg(train_augment="rrc_flip")) == ("random_resized_crop", "hflip")
  image = _image(40, 50)
  got = A.build_train_transform(cfg)(image, np.random.default_rng(4))
  r = np.random.default_rng(4)
  x = A.random_resized_crop(image, r, 24, cfg.rrc_scale, cfg.rrc_ratio, "bicubic")
  x = A.horizontal_flip(x, r)
  # timm's create_transform: fill round(255 * mean) = (124, 116, 104), the train interpolation.
  assert AA.fill_from_data_config(cfg) == (124, 116, 104)
  ra = AA.build("rand-m9-mstd0.5-inc1", fill=(124, 116, 104), interpolation="bicubic")
  np.testing.assert_array_equal(got, ra(x, r))
  # Eval is unaffected.
  eval_image = _image(24, 24)
  np.testing.assert_array_equal(A.build_eval_transform(cfg)(eval_image), eval_image)


def test_auto_augment_fill_field():
  assert AA.fill_from_data_config(_cfg(auto_augment_fill=128)) == (128, 128, 128)
  assert AA.fill_from_data_config(_cfg(mean=(0.5,), std=(0.25,))) == (128,)
  with pytest.raises(
    ValueError, match=r"data\.auto_augment_fill=256 must be an integer in \[0, 255\]"
  ):
    D.validate_data_config(_cfg(auto_augment_fill=256))


def test_auto_augment_through_pipeline_on_grayscale_digits():
  cfg = _cfg(train_augment="crop_flip", auto_augment="autoaug-svhn", num_threads=1, prefetch=1)
  src = D.DigitsSource("train")
  it = D.make_train_iterator(cfg, src, seed=0, local_batch_size=64)
  batch = next(it)
  assert batch["image"].shape == (64, 8, 8, 1) and batch["image"].dtype == np.uint8
  plain = next(
    D.make_train_iterator(_cfg(train_augment="crop_flip"), src, seed=0, local_batch_size=64)
  )
  np.testing.assert_array_equal(batch["label"], plain["label"])
  assert not np.array_equal(batch["image"], plain["image"])


# ----------------------------------------------------------------------------- RRC (bicubic)


def test_random_resized_crop_bicubic_box():
  image = _image(256, 341)
  for seed in range(5):
    out = A.random_resized_crop(image, np.random.default_rng(seed), 224)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(
      out, A.random_resized_crop(image, np.random.default_rng(seed), 224)
    )
    # The crop box from the same draws (area fraction, log aspect, top, left), resized bicubic.
    r = np.random.default_rng(seed)
    while True:
      area = 256 * 341 * r.uniform(0.08, 1.0)
      aspect = math.exp(r.uniform(math.log(3 / 4), math.log(4 / 3)))
      cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
      if 0 < cw <= 341 and 0 < ch <= 256:
        break
    top, left = int(r.integers(0, 256 - ch + 1)), int(r.integers(0, 341 - cw + 1))
    # torchvision's resized_crop (timm's RRC): crop, then resize; the filter stops at the box.
    crop = image[top : top + ch, left : left + cw]
    expected = A.resize(crop, (224, 224), "bicubic")
    np.testing.assert_array_equal(out, expected)
    assert not np.array_equal(expected, A.resize(crop, (224, 224), "bilinear"))
    reads_past_the_box = A.resize(
      image, (224, 224), "bicubic", box=(left, top, left + cw, top + ch)
    )
    assert not np.array_equal(expected, reads_past_the_box)
  outs = {A.random_resized_crop(image, np.random.default_rng(s), 64).tobytes() for s in range(6)}
  assert len(outs) == 6


def test_random_resized_crop_fallback_center_crop():
  # scale > 1 can never fit: after 10 attempts a centre crop clamped to the ratio range.
  image = _image(20, 60)  # ratio 3 > 4/3: height kept, width 20 * 4/3 = 27.
  out = A.random_resized_crop(image, np.random.default_rng(0), 16, scale=(2.0, 3.0))
  left = (60 - 27) // 2
  np.testing.assert_array_equal(out, A.resize(image[:, left : left + 27], (16, 16), "bicubic"))


def test_training_resizes_a_non_square_image_as_evaluation_does():
  """Was: training squashed a 40x48 image to 32x32 while evaluation kept its shape and cropped
  the centre, so the model trained on shapes it was never evaluated on. A square image is resized
  exactly as before."""
  rng = np.random.default_rng(0)
  cfg = _cfg(image_size=32, train_augment="crop_flip", crop_padding=0)
  resize = A._OPS["resize"](cfg)
  wide = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
  np.testing.assert_array_equal(resize(wide, rng), A.build_eval_transform(cfg)(wide))
  square = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
  np.testing.assert_array_equal(resize(square, rng), A.resize(square, (32, 32), cfg.interpolation))
