"""``config.init_from.weights`` end to end: ``--mode=predict`` and ``--mode=eval`` equal timm's on
the same images (the PyTorch reference model with timm's parameter names, timm's eval transform as
torchvision computes it), the hub name from a hand-built offline cache predicts as the file,
fine-tuning starts from the fitted weights, and each bad input is one error line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import flax
import jax
import numpy as np
import pytest
from PIL import Image

from locvit.configs.defaults import data_config
from locvit.convert import imagenet_class_names, load_pretrained
from locvit.convert.pretrained import IMAGENET_MEAN, IMAGENET_STD
from locvit.data import augment
from locvit.data.sources import decode_image
from locvit.workdir.restore import restore_model_variables

torch = pytest.importorskip("torch")
from test_pretrained import (  # noqa: E402
  CONVIT,
  DISTILLED,
  TIMM_CONFIG,
  hub_cache,
  reference,
  save,
  softmax,
  torch_heads,
)

from benchmarks import torch_reference as tr  # noqa: E402  (after the torch check)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The two-block ConViT of test_pretrained named on the command line (a bare file names no model).
MODEL_FLAGS = [
  f"--config.model.name={CONVIT[0]}",
  "--config.model.overrides.depth=2",
  "--config.model.overrides.class_token_layer=1",
  "--config.model.overrides.layer_attention=('gpsa', 'mhsa')",
]
# Sizes with odd and even margins on either side, both orientations, and one already square.
SIZES = [(40, 50), (37, 64), (64, 37), (32, 32), (45, 45), (50, 41)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("weights")
  rng = np.random.default_rng(0)
  for split, count in (("train", 8), ("test", 3)):
    for label in ("ant", "bee"):
      os.makedirs(root / "images" / split / label)
      for i in range(count):
        h, w = SIZES[(i + len(label)) % len(SIZES)]
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(
          root / "images" / split / label / f"{i}.{'png' if i % 2 else 'jpg'}"
        )
  imagenet = reference("convit")  # 1000 classes: ImageNet's names
  two = reference("convit", num_classes=2, seed=1)
  paths = {
    "root": root,
    "images": str(root / "images"),
    "imagenet": save(imagenet, root / "imagenet.safetensors"),
    "two": save(two, root / "two.safetensors"),
  }
  config = {**TIMM_CONFIG, "model_args": {"img_size": 32, "patch_size": 4, "depth": 2}}
  config["model_args"]["local_up_to_layer"] = 1
  config["pretrained_cfg"] = {**config["pretrained_cfg"], "input_size": [3, 32, 32]}
  with open(paths["imagenet"], "rb") as f:
    blobs = {"config.json": json.dumps(config).encode(), "model.safetensors": f.read()}
  paths["cache"] = hub_cache(root / "hub", "timm/convit_tiny.fb_in1k", blobs)
  return paths, {"imagenet": imagenet, "two": two}


def run_main(*args, env=None):
  full_env = {
    **os.environ,
    **(env or {}),
    "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
  }
  return subprocess.Popen(
    [sys.executable, "-m", "locvit.main", *args],
    cwd=ROOT,
    env=full_env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def finish(proc, timeout=300):
  out, err = proc.communicate(timeout=timeout)
  return proc.returncode, out, err


def timm_images(image_paths):
  """timm's eval transform of each image (ConViT's and the toy DeiT's crop_pct 0.875 at 32 px),
  NCHW."""
  return torch.stack(
    [
      tr.timm_eval_transform(Image.open(p).convert("RGB"), 32, 0.875, IMAGENET_MEAN, IMAGENET_STD)
      for p in image_paths
    ]
  )


def timm_outputs(model, image_paths):
  """timm's probabilities: its eval transform, the model in eval mode, a softmax."""
  with torch.no_grad():
    return torch.softmax(model.eval()(timm_images(image_paths)), dim=-1).numpy()


def test_eval_transform_is_timms_pixel_for_pixel(files):
  paths, _ = files
  images = sorted(
    os.path.join(folder, f) for folder, _, names in os.walk(paths["images"]) for f in names
  )
  for size, crop_pct in ((32, 0.875), (24, 0.9), (33, 1.0)):
    for path in images:
      ours = augment.resize_center_crop(decode_image(path), size, crop_pct, "bicubic")
      ours = augment.normalize(ours, IMAGENET_MEAN, IMAGENET_STD)
      theirs = tr.timm_eval_transform(
        Image.open(path).convert("RGB"), size, crop_pct, IMAGENET_MEAN, IMAGENET_STD
      )
      np.testing.assert_allclose(ours, theirs.permute(1, 2, 0).numpy(), atol=1e-5, rtol=0)


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def predictions(workdir):
  return read_jsonl(os.path.join(workdir, "predictions.jsonl"))


def test_predict_equals_timm_and_the_hub_name_predicts_as_the_file(files, tmp_path):
  paths, models = files
  data = f"--data=image_folder:{paths['images']}"
  by_file = run_main(
    "--mode=predict",
    f"--config.init_from.weights={paths['imagenet']}",
    *MODEL_FLAGS,
    data,
    f"--workdir={tmp_path / 'file'}",
  )
  offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": paths["cache"]}
  by_name = run_main(
    "--mode=predict",
    "--config.init_from.weights=convit_tiny.fb_in1k",
    data,
    f"--workdir={tmp_path / 'hub'}",
    env=offline,
  )
  for proc in (by_file, by_name):
    code, out, err = finish(proc)
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("Wrote 6 predictions to ")
  rows = predictions(tmp_path / "file")
  assert [r["file"] for r in rows] == [
    f"test/{label}/{i}.{'png' if i % 2 else 'jpg'}" for label in ("ant", "bee") for i in range(3)
  ]
  probs = timm_outputs(models["imagenet"], [os.path.join(paths["images"], r["file"]) for r in rows])
  names = imagenet_class_names()
  for row, p in zip(rows, probs, strict=True):
    expected = np.argsort(-p)[:5]
    assert row["top5"][0] == expected[0]
    np.testing.assert_allclose(row["top5_prob"], p[row["top5"]], atol=2e-4, rtol=0)
    assert row["top5_class"] == [names[i] for i in row["top5"]]
  assert predictions(tmp_path / "hub") == rows


def test_predict_with_distilled_deit_weights_equals_timm(files, tmp_path):
  """--mode=predict's work (predict.predict_weights, in process) on timm's distilled DeiT weights:
  top-1 and probabilities are timm's, the softmax of the two heads' mean logits; with
  --config.model.overrides.distilled_inference=softmax, the mean of the two heads' softmaxes.
  Probabilities to 1e-4 relative (written rounded to 6 digits)."""
  from configs.common import base_config
  from locvit.run import predict

  paths, _ = files
  model_t = reference("deit", distilled=True)
  c = base_config()
  c.data.source, c.data.root = "image_folder", paths["images"]
  c.model.name = DISTILLED[0]
  c.init_from.weights = save(model_t, tmp_path / "distilled.safetensors")
  for inference in ("logits", "softmax"):
    c.model.overrides = {**DISTILLED[1], "distilled_inference": inference}
    lines = []
    predict.predict_weights(c, str(tmp_path / inference), print_line=lines.append)
    assert lines == [f"Wrote 6 predictions to {tmp_path / inference / 'predictions.jsonl'}"]
  rows = predictions(tmp_path / "logits")
  image_paths = [os.path.join(paths["images"], r["file"]) for r in rows]
  expected = {"logits": timm_outputs(model_t, image_paths)}
  logits, dist_logits = torch_heads(model_t, timm_images(image_paths).permute(0, 2, 3, 1).numpy())
  expected["softmax"] = (softmax(logits) + softmax(dist_logits)) / 2
  names = imagenet_class_names()
  for inference, probs in expected.items():
    rows = predictions(tmp_path / inference)
    assert [os.path.join(paths["images"], r["file"]) for r in rows] == image_paths
    for row, p in zip(rows, probs, strict=True):
      assert row["top5"][0] == np.argmax(p), inference
      np.testing.assert_allclose(row["top5_prob"], p[row["top5"]], rtol=1e-4, atol=1e-6)
      assert row["top5_class"] == [names[i] for i in row["top5"]]


def test_eval_equals_timm(files, tmp_path):
  paths, models = files
  code, _, err = finish(
    run_main(
      "--mode=eval",
      f"--config.init_from.weights={paths['two']}",
      *MODEL_FLAGS,
      f"--data=image_folder:{paths['images']}",
      f"--workdir={tmp_path}",
    )
  )
  assert code == 0, err
  test_files = [
    os.path.join(paths["images"], "test", label, f"{i}.{'png' if i % 2 else 'jpg'}")
    for label in ("ant", "bee")
    for i in range(3)
  ]
  labels = np.array([0, 0, 0, 1, 1, 1])
  probs = timm_outputs(models["two"], test_files)
  (row,) = read_jsonl(tmp_path / "eval.jsonl")
  assert row["step"] == 0 and row["eval/num_examples"] == 6
  assert row["eval/top1"] == np.mean(probs.argmax(-1) == labels)
  loss = -np.mean(np.log(probs[np.arange(6), labels]))
  np.testing.assert_allclose(row["eval/loss"], loss, atol=2e-4, rtol=0)


def test_bad_inputs_are_one_line_exit_2_and_create_nothing(files, tmp_path):
  paths, _ = files
  deit = save(reference("deit"), tmp_path / "deit.safetensors")
  state = {k: v.numpy() for k, v in reference("convit").state_dict().items()}
  state["pos_embed"] = state["pos_embed"][:, :60]
  np.savez(tmp_path / "odd.npz", **state)
  missing = str(tmp_path / "missing.safetensors")
  cases = {
    "missing": ([missing], f"{missing}: no such file or directory; give a .safetensors"),
    "offline": (
      ["deit_tiny_patch16_224.fb_in1k"],
      "timm/deit_tiny_patch16_224.fb_in1k/config.json is not in the Hugging Face cache",
    ),
    "architecture": ([deit, *MODEL_FLAGS], "these are DeiT weights (without GPSA gating_param)"),
    "shape": ([str(tmp_path / "odd.npz"), *MODEL_FLAGS], "pos_embed has 60 rows"),
  }
  offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": paths["cache"]}
  procs = {
    case: run_main(
      "--mode=predict",
      f"--config.init_from.weights={args[0]}",
      *args[1:],
      f"--data=image_folder:{paths['images']}",
      f"--workdir={tmp_path / case}",
      env=offline,
    )
    for case, (args, _) in cases.items()
  }
  for case, proc in procs.items():
    code, _, err = finish(proc)
    assert code == 2, (case, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("locvit: error: ") and cases[case][1] in line, (case, line)
    assert not (tmp_path / case).exists(), case


def test_finetune_from_weights_at_another_size_and_class_count(files, tmp_path):
  """A 2-class run at 48 px from the 1000-class 32 px weights starts from load_pretrained's
  variables (timm's resampled pos_embed, a fresh head); with everything but the head frozen,
  only the head moves; the step and the optimizer start fresh."""
  from configs.common import base_config
  from locvit import train

  paths, _ = files
  c = base_config()
  c.data.source, c.data.root = "image_folder", paths["images"]
  c.data.image_size, c.data.train_augment = 48, "none"
  c.model.name = CONVIT[0]
  c.model.overrides = dict(CONVIT[1])
  c.init_from.weights = paths["imagenet"]
  c.freeze = (r"^(?!head/).*",)
  c.batch_size, c.total_steps, c.eval_every_steps = 8, 2, 0
  c.checkpoint_every_steps, c.async_checkpointing = 0, False
  train.train_and_evaluate(c, str(tmp_path))
  fitted = load_pretrained(
    paths["imagenet"], model=CONVIT[0], num_classes=2, img_size=48, seed=c.seed + 1, **CONVIT[1]
  )
  model = fitted.create_model()
  params, _, step = restore_model_variables(str(tmp_path), model, (48, 48, 3))
  assert step == 2
  trained = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  start = flax.traverse_util.flatten_dict(fitted.variables["params"], sep="/")
  assert trained["pos_embed"].shape == (1, 144, 192) and trained["head/kernel"].shape == (192, 2)
  for key, value in start.items():
    if key.startswith("head/"):
      assert not np.array_equal(trained[key], value), key
    else:
      np.testing.assert_array_equal(trained[key], value, err_msg=key)


def test_predict_names_an_unreadable_image_and_shows_progress(tmp_path, monkeypatch):
  """A folder of loose images, one of them not an image: it is named and left out, the others
  predicted; a progress line at each batch (PROGRESS_SECONDS 0); the file appears whole."""
  from locvit.run import predict

  folder = tmp_path / "loose"
  (folder / "sub").mkdir(parents=True)
  rng = np.random.default_rng(0)
  for name in ("a.png", "sub/b.jpg", "c.png"):
    Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(folder / name)
  (folder / "broken.jpg").write_text("not an image")
  files, classes = predict.image_files(str(folder), "test")
  assert classes is None and len(files) == 4
  monkeypatch.setattr(predict, "PROGRESS_SECONDS", 0.0)
  lines, warnings = [], []
  data = data_config()
  data.image_size, data.eval_crop_pct = 16, 0.875
  logits = np.arange(10, dtype=np.float32)
  predict.predict(
    lambda images: np.broadcast_to(logits, (images.shape[0], 10)),
    data,
    files,
    str(folder),
    [f"class {i}" for i in range(10)],
    str(tmp_path / "out"),
    batch_size=2,
    print_line=lines.append,
    warn=warnings.append,
  )
  (warning,) = warnings
  assert warning.startswith("locvit: skipped an unreadable image: cannot decode image file")
  assert "broken.jpg" in warning
  assert re.fullmatch(r"predicting: 2/4 images \(\d+ s\)", lines[0]) and len(lines) == 2
  written = tmp_path / "out" / "predictions.jsonl"
  assert lines[-1] == f"Wrote 3 predictions to {written} (1 unreadable image(s) skipped)"
  rows = predictions(tmp_path / "out")
  assert [r["file"] for r in rows] == ["a.png", "c.png", "sub/b.jpg"]
  expected = np.exp(logits) / np.exp(logits).sum()
  for row in rows:
    assert row["top5"] == [9, 8, 7, 6, 5] and row["top5_class"][0] == "class 9"
    np.testing.assert_allclose(row["top5_prob"], expected[[9, 8, 7, 6, 5]], atol=1e-6)
  assert not (tmp_path / "out" / "predictions.jsonl.partial").exists()


def test_predict_in_a_training_runs_workdir_names_the_export(tmp_path):
  """--mode=predict on a run's workdir, without weights: the line names the command that writes
  the run's weights (python -m locvit.convert --workdir) and changes nothing there."""
  from locvit.workdir import saved_config
  from tests.train_utils import tiny_config

  run = tmp_path / "run"
  run.mkdir()
  saved_config.write(str(run), tiny_config())
  before = sorted(os.listdir(run))
  code, _, err = finish(run_main("--mode=predict", f"--workdir={run}", "--data=image_folder:x"))
  assert (code, err.strip().splitlines()) == (
    2,
    [
      f"locvit: error: --mode=predict runs weights, and {run} holds a training run: write its "
      f"weights with python -m locvit.convert --workdir={run} --output=WEIGHTS, then give "
      "--config.init_from.weights=WEIGHTS and a new --workdir"
    ],
  )
  assert sorted(os.listdir(run)) == before
