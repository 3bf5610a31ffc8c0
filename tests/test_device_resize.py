"""The random-resized crop under data.augment_on='device': the host cuts the box, the train step
resizes it with Pillow's own taps (``locvit.data.resample``), equal to the host op bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from locvit.data import (
  augment,
  default_data_config,
  make_source,
  make_train_iterator,
  resample,
  validate_data_config,
)
from locvit.data import device_augment as da


def data_cfg(**fields):
  c = default_data_config()
  c.update(fields)
  return c


def device_crops(cfg, images, seeds):
  """The device path for each (image, seed): the host's cut, the batch canvas, the step's resize."""
  cut = resample.box_cutter(cfg)
  parts = [cut(image, np.random.default_rng(seed)) for image, seed in zip(images, seeds)]
  canvas = resample.on_canvas([p["image"] for p in parts], resample.canvas_size(cfg))
  taps = np.stack([p["resize_taps"] for p in parts])
  transposed = np.stack([p["resize_transposed"] for p in parts])
  return np.asarray(jax.jit(da.resize_from_taps)(canvas, taps, transposed)), transposed


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_device_crop_equals_the_host_crop_bit_for_bit(interpolation):
  """Random sizes and boxes, up- and downscaling, both of Pillow's pass orders, 1 and 3 channels,
  and boxes too large for the canvas (resized on the host, sent with identity taps)."""
  cfg = data_cfg(image_size=24, rrc_canvas=40, interpolation=interpolation)
  rng = np.random.default_rng(0)
  images = [
    rng.integers(0, 256, (*rng.integers(6, 90, 2), 1 + 2 * (i % 2)), dtype=np.uint8)
    for i in range(96)
  ]
  for channels in (1, 3):
    group = [im for im in images if im.shape[2] == channels]
    seeds = range(len(group))
    got, transposed = device_crops(cfg, group, seeds)
    host = [
      augment.random_resized_crop(im, np.random.default_rng(s), 24, interpolation=interpolation)
      for im, s in zip(group, seeds)
    ]
    np.testing.assert_array_equal(got, np.stack(host))
    if resample.PILLOW_ORDERS_PASSES:
      assert 0 < transposed.sum() < len(group)  # Both pass orders were exercised.
  big = [im for im in images if max(im.shape[:2]) > 60]
  assert any(max(b.shape[:2]) > 40 for b in big)


def test_device_crop_at_224_from_a_341_by_256_image():
  image = np.asarray(
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 85, 3), dtype=np.uint8)).resize(
      (341, 256), Image.Resampling.BICUBIC
    )
  )
  cfg = data_cfg(image_size=224)  # rrc_canvas None: a 448 square, every box of this image fits.
  got, _ = device_crops(cfg, [image] * 3, range(3))
  for seed in range(3):
    np.testing.assert_array_equal(
      got[seed], augment.random_resized_crop(image, np.random.default_rng(seed), 224)
    )


def test_taps_are_pillows_resize_for_any_size():
  """``taps`` against ``Image.resize`` on one axis at a time (the other kept), sizes 1..300."""
  rng = np.random.default_rng(2)
  for in_size, out_size in [(1, 5), (5, 1), (7, 7), (300, 17), (17, 300), (341, 224), (97, 224)]:
    row = rng.integers(0, 256, (3, in_size), dtype=np.uint8)
    for interpolation, resample_filter in [
      ("bicubic", Image.Resampling.BICUBIC),
      ("bilinear", Image.Resampling.BILINEAR),
    ]:
      expected = np.asarray(Image.fromarray(row).resize((out_size, 3), resample_filter))
      width = resample.tap_count(in_size, out_size, interpolation)
      taps = resample.taps(in_size, out_size, interpolation, width)
      got = jax.jit(da._resample_width)(jnp.asarray(row[:, :, None], jnp.int32), taps)
      np.testing.assert_array_equal(np.asarray(got)[:, :, 0], expected)


def write_folder(root, sizes):
  rng = np.random.default_rng(3)
  for k, (h, w) in enumerate(sizes):
    folder = root / "train" / "ab"[k % 2]
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{k}.png")


def test_the_pipeline_sends_boxes_on_a_canvas_that_the_step_resizes_to_the_host_crop(tmp_path):
  """Same seed, same boxes: each device-resized row is the host path's row, or its mirror (the
  flip is drawn on the host in one path and in the step in the other)."""
  write_folder(tmp_path, [(20, 30), (33, 17), (24, 24), (40, 28), (18, 45), (26, 31)] * 2)
  common = dict(
    source="image_folder",
    root=str(tmp_path),
    image_size=16,
    train_augment="rrc_flip",
    num_threads=1,
    prefetch=1,
  )
  device_cfg, host_cfg = data_cfg(augment_on="device", **common), data_cfg(**common)
  source = make_source(device_cfg, "train")
  batch = next(make_train_iterator(device_cfg, source, seed=5, local_batch_size=8))
  host = next(make_train_iterator(host_cfg, source, seed=5, local_batch_size=8))
  assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == np.uint8
  assert batch["resize_taps"].shape == (8, 2, 16, 1 + resample.tap_count(32, 16, "bicubic"))
  assert batch["resize_transposed"].dtype == np.bool_
  got = np.asarray(
    da.resize_from_taps(batch["image"], batch["resize_taps"], batch["resize_transposed"])
  )
  for row, expected in zip(got, host["image"]):
    assert np.array_equal(row, expected) or np.array_equal(row, expected[:, ::-1])
  np.testing.assert_array_equal(batch["label"], host["label"])


def test_rrc_canvas_smaller_than_the_image_size_is_refused():
  with pytest.raises(ValueError) as e:
    validate_data_config(data_cfg(image_size=224, rrc_canvas=200))
  assert str(e.value) == "data.rrc_canvas=200 must be an integer in [224, 65536]"


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_device_crop_lowers_for_accelerators_without_host_callbacks(platform):
  cfg = data_cfg(image_size=16, train_augment="rrc_flip", augment_on="device")
  width = 1 + resample.tap_count(32, 16, "bicubic")
  batch = {
    "image": jnp.zeros((4, 32, 32, 3), jnp.uint8),
    "resize_taps": jnp.zeros((4, 2, 16, width), jnp.int32),
    "resize_transposed": jnp.zeros((4,), bool),
  }
  whole_images = {"image": batch["image"]}  # the training split on the device: boxes drawn here
  for inputs in (batch, whole_images):
    recipe = jax.jit(lambda k, b: da.recipe_ops(k, b, cfg, platform="gpu"))
    lowered = recipe.trace(jax.random.key(0), inputs)
    text = lowered.lower(lowering_platforms=(platform,)).as_text()
    assert "stablehlo.gather" in text and "custom_call" not in text
    assert "callback" not in text.lower()


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_a_box_drawn_on_the_device_is_resized_as_pillow_resizes_it(interpolation):
  """Whole images (the training split on the device): the step draws each box and reads its taps
  from ``resample.tap_tables``; the result is Pillow's resize of the cut box, bit for bit, in both
  of Pillow's pass orders (a 64 x 40 image to 24 makes tall boxes that Pillow resizes height
  first; a 20 x 24 image never does)."""
  cfg = data_cfg(image_size=24, interpolation=interpolation)
  for channels, (height, width) in ((1, (64, 40)), (3, (64, 40)), (3, (20, 24))):
    shape = (64, height, width, channels)
    images = np.random.default_rng(channels).integers(0, 256, shape, np.uint8)
    key = jax.random.key(channels)
    crop = jax.jit(lambda key, images: da.random_resized_crop(key, images, cfg))
    got = np.asarray(crop(key, images))
    scale, ratio = tuple(cfg.rrc_scale), tuple(cfg.rrc_ratio)
    boxes = np.stack(da.random_resized_crop_boxes(key, 64, height, width, scale, ratio), axis=1)
    for image, out, (left, top, w, h) in zip(images, got, boxes):
      box = image[top : top + h, left : left + w]
      np.testing.assert_array_equal(out, augment.resize(box, (24, 24), interpolation))
    tall = [resample.vertical_first(h, w, 24, 24) for _, _, w, h in boxes]
    if height > 24 and resample.PILLOW_ORDERS_PASSES:
      assert 0 < sum(tall) < len(tall)
    assert height > 24 or not any(tall)


def test_device_boxes_follow_the_host_boxes_distribution():
  """The device draw is timm's algorithm on another random stream: the same distribution of box
  area, aspect and position (20,000 boxes each; the means within 4 standard errors), and the same
  centre-crop fallback where no attempt fits."""
  scale, ratio, n = (0.08, 1.0), (3 / 4, 4 / 3), 20_000
  rng = np.random.default_rng(0)
  host = np.array([augment.random_resized_crop_box(32, 32, rng, scale, ratio) for _ in range(n)])
  host = np.stack([host[:, 0], host[:, 1], host[:, 2] - host[:, 0], host[:, 3] - host[:, 1]], 1)
  device = np.stack(da.random_resized_crop_boxes(jax.random.key(0), n, 32, 32, scale, ratio), 1)
  stats = lambda b: np.stack(
    [b[:, 2] * b[:, 3] / 1024, np.log(b[:, 2] / b[:, 3]), b[:, 0], b[:, 1]]
  )
  for name, h, d in zip(("area", "log aspect", "left", "top"), stats(host), stats(device)):
    se = np.sqrt(h.var() / n + d.var() / n)
    assert abs(h.mean() - d.mean()) < 4 * se, (name, h.mean(), d.mean())
  assert (device[:, 2] <= 32).all() and (device[:, 0] + device[:, 2] <= 32).all()
  never_fits = da.random_resized_crop_boxes(jax.random.key(1), 4, 32, 8, (0.9, 1.0), (2.0, 3.0))
  expected = augment.random_resized_crop_box(32, 8, None, (0.9, 1.0), (2.0, 3.0), attempts=0)
  x0, y0, x1, y1 = expected
  assert [np.asarray(v).tolist() for v in never_fits] == [
    [x0] * 4,
    [y0] * 4,
    [x1 - x0] * 4,
    [y1 - y0] * 4,
  ]
