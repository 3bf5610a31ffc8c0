"""On-device batch augmentation: random erasing, Mixup, CutMix and the soft targets they make."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locvit.configs import defaults
from locvit.data import device_augment as da

B, H, W, C, K = 8, 16, 12, 3, 5


def images(seed=0):
  return jax.random.normal(jax.random.key(seed), (B, H, W, C))


def mixup_cfg(**fields):
  c = defaults.mixup_config()
  c.update(fields)
  return c


def erasing_cfg(**fields):
  c = defaults.erasing_config()
  c.update(fields)
  return c


def constant_batch():
  """Example i is the constant image i + 1 (so every pixel tells which example it came from)."""
  return jnp.broadcast_to(jnp.arange(1.0, B + 1.0)[:, None, None, None], (B, H, W, C))


LABELS = jnp.arange(B) % K


# ----------------------------------------------------------------------------- random erasing


def test_erasing_boxes_area_fill_and_determinism():
  x = images()
  cfg = erasing_cfg(prob=1.0)
  out = da.random_erasing(jax.random.key(1), x, cfg)
  assert out.shape == x.shape and out.dtype == x.dtype
  np.testing.assert_array_equal(out, da.random_erasing(jax.random.key(1), x, cfg))
  assert not np.array_equal(out, da.random_erasing(jax.random.key(2), x, cfg))
  changed = np.asarray(jnp.any(out != x, axis=-1))  # (B, H, W)
  for mask in changed:
    rows, cols = np.nonzero(mask)
    # One axis-aligned box per example, of area in [min_area, max_area] up to rounding.
    h, w = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
    assert mask.sum() == h * w
    assert 0.02 * H * W * 0.5 <= h * w <= H * W / 3 * 1.5
  # 'pixel' fills with N(0, 1) noise: the erased values are fresh, not the image's.
  erased = np.asarray(out)[changed]
  assert abs(erased.mean()) < 0.3 and 0.7 < erased.std() < 1.3


def test_erasing_probability_modes_and_identity():
  x = images()
  np.testing.assert_array_equal(da.random_erasing(jax.random.key(0), x, erasing_cfg(prob=0.0)), x)
  const = da.random_erasing(jax.random.key(0), x, erasing_cfg(prob=1.0, mode="const"))
  assert np.all((np.asarray(const) == 0) | (np.asarray(const) == np.asarray(x)))
  rand = np.asarray(da.random_erasing(jax.random.key(0), x, erasing_cfg(prob=1.0, mode="rand")))
  for i in range(B):  # one colour per box and channel
    box = np.any(rand[i] != np.asarray(x[i]), axis=-1)
    assert len(np.unique(rand[i][box], axis=0)) == 1
  # prob 0.5 over many examples erases about half of them.
  big = jnp.zeros((400, 8, 8, 1))
  hit = np.any(
    np.asarray(da.random_erasing(jax.random.key(3), big, erasing_cfg(prob=0.5))) != 0,
    axis=(1, 2, 3),
  )
  assert 0.4 < hit.mean() < 0.6


def _box_sides(erased: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Heights and widths of the one box per example where ``erased`` (B, H, W) is True."""
  return erased.any(axis=2).sum(axis=1), erased.any(axis=1).sum(axis=1)


def test_erasing_official_fill_and_uniform_aspect():
  """Zhong et al.'s ``RandomErasing`` as the GMM code runs it: the box takes the colour ``fill``
  (the dataset mean's numbers, in normalised space) and its aspect h / w is uniform in
  [0.3, 1 / 0.3], so about 0.7 / 3.03 = 23% of boxes are wider than tall, against half under
  timm's log-uniform aspect."""
  fill = (0.4914, 0.4822, 0.4465)
  x = jnp.full((600, 64, 64, 3), -5.0)
  official = erasing_cfg(
    prob=1.0, mode="const", fill=fill, aspect="uniform", attempts=100, min_area=0.1, max_area=0.1
  )
  out = np.asarray(da.random_erasing(jax.random.key(0), x, official))
  erased = out[..., 0] != -5.0
  np.testing.assert_array_equal(out[erased], np.broadcast_to(np.float32(fill), (erased.sum(), 3)))
  heights, widths = _box_sides(erased)
  assert (heights > 0).all()  # 100 draws: every example gets its box
  assert 0.18 < np.mean(heights < widths) < 0.28
  timm = erasing_cfg(prob=1.0, mode="const", min_area=0.1, max_area=0.1)
  heights, widths = _box_sides(
    np.asarray(da.random_erasing(jax.random.key(0), x, timm))[..., 0] == 0
  )
  assert 0.42 < np.mean(heights < widths) < 0.58
  with pytest.raises(ValueError, match=r"random_erasing.aspect='square' is not one of"):
    da.validate_erasing_config(erasing_cfg(aspect="square"))
  with pytest.raises(ValueError, match=r"random_erasing.fill=\(0.5,\) is mode 'const''s colour"):
    da.validate_erasing_config(erasing_cfg(fill=(0.5,)))


# ----------------------------------------------------------------------------- mixup / cutmix


def test_soft_targets_fold_label_smoothing():
  t = da.soft_targets(LABELS, K, 0.1)
  np.testing.assert_allclose(t.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(t[0], [0.92, 0.02, 0.02, 0.02, 0.02], rtol=1e-6)
  x, targets = da.mix_batch(jax.random.key(0), images(), LABELS, mixup_cfg(), K, 0.1)
  np.testing.assert_array_equal(x, images())  # mixing off: identity, smoothed one-hot
  np.testing.assert_allclose(targets, t)


def test_mixup_is_a_convex_combination_with_the_mirrored_batch():
  x = images()
  cfg = mixup_cfg(mixup_alpha=0.8)
  mixed, targets = da.mix_batch(jax.random.key(4), x, LABELS, cfg, K, 0.0)
  lam = float(targets[0, LABELS[0]]) if LABELS[0] != LABELS[-1] else None
  assert lam is not None and 0 < lam < 1
  np.testing.assert_allclose(mixed, lam * x + (1 - lam) * x[::-1], rtol=1e-5, atol=1e-6)
  expected = lam * da.soft_targets(LABELS, K, 0) + (1 - lam) * da.soft_targets(LABELS[::-1], K, 0)
  np.testing.assert_allclose(targets, expected, rtol=1e-5)
  # With label smoothing the mix applies to the smoothed targets (timm's mixup_target).
  _, smooth = da.mix_batch(jax.random.key(4), x, LABELS, cfg, K, 0.1)
  expected = lam * da.soft_targets(LABELS, K, 0.1) + (1 - lam) * da.soft_targets(
    LABELS[::-1], K, 0.1
  )
  np.testing.assert_allclose(smooth, expected, rtol=1e-5)
  np.testing.assert_allclose(smooth.sum(-1), 1.0, rtol=1e-6)


def test_cutmix_pastes_one_box_and_lam_is_the_area_kept():
  x = constant_batch()
  cfg = mixup_cfg(cutmix_alpha=1.0)
  seen_fractions = []
  for seed in range(20):
    mixed, targets = da.mix_batch(jax.random.key(seed), x, LABELS, cfg, K, 0.0)
    mixed = np.asarray(mixed)
    pasted = mixed[..., 0] == np.asarray(x[::-1])[..., 0]  # (B, H, W)
    kept = mixed[..., 0] == np.asarray(x)[..., 0]
    assert np.all(pasted | kept)
    # 'batch' mode: the same box for every example.
    assert all(np.array_equal(pasted[0], pasted[i]) for i in range(B) if i != B - 1 - i)
    fraction = pasted[0].mean()
    lam = float(targets[0, LABELS[0]])  # labels 0 and 2 differ
    np.testing.assert_allclose(lam, 1 - fraction, rtol=1e-6)  # correct_lam: exact area kept
    if 0 < fraction < 1:
      rows, cols = np.nonzero(pasted[0])
      assert pasted[0].sum() == (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    seen_fractions.append(fraction)
  assert 0.15 < np.mean(seen_fractions) < 0.6  # Beta(1, 1) area, less what the border clips


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.8, 1.0, 2.0])
def test_symmetric_beta_draws_beta_alpha_alpha(alpha):
  from scipy import stats

  draws = np.asarray(da.symmetric_beta(jax.random.key(7), alpha, (20_000,)), np.float64)
  assert draws.min() >= 0 and draws.max() <= 1
  assert stats.kstest(draws, stats.beta(alpha, alpha).cdf).pvalue > 1e-3
  # The test tells neighbouring concentrations apart at this sample size.
  assert stats.kstest(draws, stats.beta(alpha * 1.25, alpha * 1.25).cdf).pvalue < 1e-6


def test_each_kind_of_mix_draws_its_own_lam_and_cutmix_is_chosen_at_switch_prob():
  """'elem' mode with Mixup and CutMix told apart (alphas 0.5 and 4): CutMix for a quarter of the
  examples at switch_prob 0.25, and each kind's lam from its own Beta(alpha, alpha)."""
  from scipy import stats

  cfg = mixup_cfg(mixup_alpha=0.5, cutmix_alpha=4.0, switch_prob=0.25, mode="elem")
  lam, use_cutmix = map(np.asarray, da._sample_lam(jax.random.key(3), cfg, (8_000,)))
  assert abs(use_cutmix.mean() - 0.25) < 0.02
  assert stats.kstest(lam[use_cutmix], stats.beta(4.0, 4.0).cdf).pvalue > 1e-3
  assert stats.kstest(lam[~use_cutmix], stats.beta(0.5, 0.5).cdf).pvalue > 1e-3
  assert stats.kstest(lam[~use_cutmix], stats.beta(4.0, 4.0).cdf).pvalue < 1e-6  # told apart


def test_the_mixing_draw_has_no_loop_for_a_gpu_to_wait_on():
  """Lowered for a GPU, DeiT's Mixup 0.8 / CutMix 1.0 draw lam with no while loop (each test of
  a loop's condition is a copy to the host and a wait there); an alpha below 1/2 keeps
  ``jax.random.beta``'s rejection loop."""

  def lowered(mixup_alpha):
    cfg = mixup_cfg(mixup_alpha=mixup_alpha, cutmix_alpha=1.0)
    mix = jax.jit(lambda key, x: da.mix_batch(key, x, LABELS, cfg, K, 0.1))
    return mix.trace(jax.random.key(0), images()).lower(lowering_platforms=("cuda",)).as_text()

  assert "stablehlo.while" not in lowered(0.8)
  assert "stablehlo.while" in lowered(0.3)


def test_switch_probability_and_elementwise_mode():
  x = constant_batch()
  both = mixup_cfg(mixup_alpha=1.0, cutmix_alpha=1.0, switch_prob=0.5)
  kinds = []
  for seed in range(40):
    mixed = np.asarray(da.mix_batch(jax.random.key(seed), x, LABELS, both, K, 0.0)[0])
    values = np.unique(mixed[0])
    kinds.append(set(values) <= {1.0, float(B)})  # CutMix keeps original pixel values
  assert 0.25 < np.mean(kinds) < 0.75
  elem = mixup_cfg(mixup_alpha=1.0, mode="elem")
  mixed, targets = da.mix_batch(jax.random.key(0), x, LABELS, elem, K, 0.0)
  lams = [float(targets[i, LABELS[i]]) for i in range(B) if LABELS[i] != LABELS[B - 1 - i]]
  assert len(set(np.round(lams, 6))) > 1  # one lam per example
  off = mixup_cfg(mixup_alpha=1.0, prob=0.0)
  np.testing.assert_array_equal(da.mix_batch(jax.random.key(0), x, LABELS, off, K, 0.0)[0], x)


def test_augment_batch_is_deterministic_and_jits():
  fn = jax.jit(
    lambda key, x, y: da.augment_batch(
      key,
      x,
      y,
      mixup=mixup_cfg(mixup_alpha=0.8, cutmix_alpha=1.0),
      erasing=erasing_cfg(prob=0.25),
      num_classes=K,
      label_smoothing=0.1,
    )
  )
  a = fn(jax.random.key(7), images(), LABELS)
  b = fn(jax.random.key(7), images(), LABELS)
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert a[1].shape == (B, K)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
  "fields, num_classes, match",
  [
    ({"mixup_alpha": -1.0}, 10, r"mixup.mixup_alpha=-1.0 must be >= 0"),
    ({"prob": 1.5}, 10, r"mixup.prob=1.5 must be a probability"),
    ({"mode": "pair"}, 10, r"mixup.mode='pair' is not one of \('batch', 'elem'\)"),
    ({"mixup_alpha": 0.8}, 1, r"needs integer class labels and num_classes >= 2"),
    ({"cutmix_alpha": 1.0}, None, r"num_classes=None"),
  ],
)
def test_bad_mixup_config(fields, num_classes, match):
  with pytest.raises(ValueError, match=match):
    da.validate_mixup_config(mixup_cfg(**fields), num_classes)


@pytest.mark.parametrize(
  "fields, match",
  [
    ({"prob": -0.1}, r"random_erasing.prob=-0.1 must be a probability"),
    ({"mode": "noise"}, r"random_erasing.mode='noise' is not one of"),
    ({"min_area": 0.5, "max_area": 0.2}, r"0 < min_area <= max_area <= 1"),
  ],
)
def test_bad_erasing_config(fields, match):
  with pytest.raises(ValueError, match=match):
    da.validate_erasing_config(erasing_cfg(**fields))


IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@pytest.mark.parametrize(
  "channels, mean, std", [(3, *IMAGENET), (1, (0.5,), (0.5,)), (1, *IMAGENET)]
)
def test_uint8_batches_are_normalised_on_the_device_as_on_the_host(channels, mean, std):
  """The host sends uint8; the step's normalisation equals the host's (x / 255 - mean) / std to
  float32 rounding, RGB statistics on greyscale included. A float batch passes unchanged."""
  from ml_collections import ConfigDict

  from locvit.data import augment

  images = np.random.default_rng(0).integers(0, 256, (4, 5, 5, channels), dtype=np.uint8)
  data = ConfigDict({"mean": mean, "std": std})
  got = jax.jit(lambda x: da.normalize(x, data))(images)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, augment.normalize(images, mean, std), rtol=0, atol=1e-6)
  floats = jnp.ones((2, 3, 3, channels))
  assert da.normalize(floats, data) is floats


# ----------------------------------------------------------------------------- recipe ops


def data_cfg(**fields):
  from locvit.data import default_data_config

  c = default_data_config()
  c.update(fields)
  return c


class FixedDraws:
  """A stand-in generator whose integer draws are given: the host op's offsets, set by hand."""

  def __init__(self, *values):
    self.values = list(values)

  def integers(self, lo, hi):
    return self.values.pop(0)


@pytest.mark.parametrize("padding", [0, 1, 4])
def test_the_device_pad_crop_equals_the_host_op_pixel_for_pixel(padding):
  """Every window offset of the device crop gives the host op's exact pixels (zero padding)."""
  from locvit.data import augment

  rng = np.random.default_rng(padding)
  image = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
  offsets = [(t, l) for t in range(2 * padding + 1) for l in range(2 * padding + 1)]  # noqa: E741
  top, left = (jnp.array(o) for o in zip(*offsets, strict=True))
  batch = jnp.broadcast_to(image, (len(offsets), *image.shape))
  got = np.asarray(jax.jit(da.crop_at, static_argnums=3)(batch, top, left, padding))
  for k, (t, l) in enumerate(offsets):  # noqa: E741
    want = augment.random_crop_with_padding(image, FixedDraws(t, l), 6, padding)
    np.testing.assert_array_equal(got[k], want)
  flipped = np.asarray(da.flip_where(jnp.stack([image, image]), jnp.array([False, True])))
  np.testing.assert_array_equal(flipped[1], image[:, ::-1])
  np.testing.assert_array_equal(flipped[0], image)


def test_device_crop_offsets_and_flips_are_uniform_per_example_and_follow_the_key():
  """Offsets uniform over the 2p + 1 positions, flips with probability 1/2, independent per
  example; the same key gives the same batch (exact resume), another key another one."""
  padding, n = 2, 4500
  rows = np.arange(1, 9, dtype=np.uint8)  # pixel value = image row + 1, so the offset is readable
  image = np.broadcast_to(rows[:, None, None], (8, 8, 1))
  image = np.concatenate([image, np.broadcast_to(rows[None, :, None], (8, 8, 1))], axis=-1)
  batch = jnp.broadcast_to(image, (n, 8, 8, 2))
  cfg = data_cfg(train_augment="crop_flip", augment_on="device", crop_padding=padding)
  recipe = jax.jit(lambda k, x: da.recipe_ops(k, {"image": x}, cfg, platform="cpu"))
  out = np.asarray(recipe(jax.random.key(0), batch))
  centre = out[:, 4, 4]  # never padding for padding <= 2 on an 8x8 image
  tops = centre[:, 0].astype(int) - 1 - 4 + padding
  cols = centre[:, 1].astype(int) - 1
  flipped = out[:, 4, 3, 1] > out[:, 4, 4, 1]  # the column ramp runs backwards
  lefts = np.where(flipped, 7 - cols - 4 + padding, cols - 4 + padding)
  expected, sd = n / 5, np.sqrt(n * 0.2 * 0.8)
  for offsets in (tops, lefts):
    counts = np.bincount(offsets, minlength=5)
    assert len(counts) == 5 and np.all(np.abs(counts - expected) < 4.5 * sd), counts
  assert abs(flipped.mean() - 0.5) < 4.5 * np.sqrt(0.25 / n)
  assert abs(np.corrcoef(tops, lefts)[0, 1]) < 0.06 and abs(np.corrcoef(tops, flipped)[0, 1]) < 0.06
  again = recipe(jax.random.key(0), batch)
  np.testing.assert_array_equal(out, again)
  other = recipe(jax.random.key(1), batch)
  assert not np.array_equal(out, other)


def test_augment_on_device_moves_the_trailing_device_ops_and_refuses_when_nothing_moves():
  from locvit.data import augment, validate_data_config

  def split(**fields):
    return augment.split_train_ops(data_cfg(**fields))

  assert split(train_augment="crop_flip") == (("resize", "pad_crop", "hflip"), ())
  assert split(train_augment="crop_flip", augment_on="device") == (
    ("resize",),
    ("pad_crop", "hflip"),
  )
  assert split(train_augment="rrc_flip", augment_on="device") == (
    (),
    ("random_resized_crop", "hflip"),
  )
  # data.auto_augment runs last, so the whole tail moves, in order.
  assert split(train_augment="crop_flip", auto_augment="autoaug-cifar10", augment_on="device") == (
    ("resize",),
    ("pad_crop", "hflip", "auto_augment"),
  )
  assert split(train_augment="none", auto_augment="rand-m9", augment_on="device") == (
    ("resize_center_crop",),
    ("auto_augment",),
  )
  with pytest.raises(ValueError) as e:
    validate_data_config(data_cfg(train_augment="none", augment_on="device"))
  assert str(e.value) == (
    "data.augment_on='device' moves a trailing run of random_resized_crop, pad_crop, hflip, "
    "auto_augment into the train step, but data.train_augment='none' ends with "
    "'resize_center_crop', which runs on the host only; set data.augment_on='host'"
  )
  with pytest.raises(ValueError, match=r"data.augment_on='gpu' is not one of \['device', 'host'\]"):
    validate_data_config(data_cfg(augment_on="gpu"))


def test_the_host_pipeline_leaves_the_moved_ops_to_the_step():
  """With augment_on='device' the host sends the decoded (resized) images as they are."""
  from locvit.data import DigitsSource, make_train_iterator

  source = DigitsSource("train")
  cfg = data_cfg(train_augment="crop_flip", augment_on="device", num_threads=1, prefetch=1)
  batch = next(make_train_iterator(cfg, source, seed=0, local_batch_size=16))
  order = np.random.default_rng([0, 0, 0]).permutation(len(source))[:16]
  np.testing.assert_array_equal(batch["image"], source.images[order])


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_device_augmentation_lowers_for_accelerators_without_host_callbacks(platform):
  """Crop, flip, normalisation, erasing and Mixup/CutMix lower as one device program."""
  cfg = data_cfg(train_augment="crop_flip", augment_on="device", image_size=16)
  mixup = mixup_cfg(mixup_alpha=0.8, cutmix_alpha=1.0)

  def augment(key, images, labels):
    images = da.normalize(da.recipe_ops(key, {"image": images}, cfg, platform="cpu"), cfg)
    return da.augment_batch(
      key,
      images,
      labels,
      mixup=mixup,
      erasing=erasing_cfg(prob=0.25),
      num_classes=K,
      label_smoothing=0.1,
    )

  images = jnp.zeros((B, 16, 16, C), jnp.uint8)
  lowered = jax.jit(augment).trace(jax.random.key(0), images, LABELS)
  text = lowered.lower(lowering_platforms=(platform,)).as_text()
  assert "stablehlo.gather" in text and "stablehlo.reverse" in text  # the crop and the flip
  assert "custom_call" not in text and "callback" not in text.lower()
