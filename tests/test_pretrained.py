"""Published weights (``locvit.convert.load_pretrained``): timm's resampled position embedding, a
fresh head, the hub cache read offline, and one line for each bad input. The weights are saved
from the PyTorch reference modules with timm's parameter names
(``benchmarks/torch_reference.py``)."""

from __future__ import annotations

import json

import flax
import jax
import numpy as np
import pytest

from locvit.convert import (
  WeightsError,
  from_timm,
  imagenet_class_names,
  load_pretrained,
  resolve_weights,
)
from locvit.models import create_model
from locvit.models.convit import convit_overrides
from locvit.models.resampling import resample_abs_pos_embed

torch = pytest.importorskip("torch")
from benchmarks import torch_reference as tr  # noqa: E402  (after the torch check)

# Two-block models at 32 px (patch 4, an 8x8 grid): every code path of the full sizes, in seconds.
CONVIT = ("convit_tiny_patch4_32", dict(convit_overrides(1, depth=2)))
DEIT = ("deit_tiny_patch4_32", dict(depth=2))
DISTILLED = ("deit_tiny_distilled_patch4_32", dict(depth=2))  # timm's deit_*_distilled_*
TORCH_KWARGS = dict(depth=2, img_size=32, patch_size=4)


def reference(
  family: str, num_classes: int = 1000, img_size: int = 32, seed: int = 0, distilled: bool = False
):
  torch.manual_seed(seed)
  extra = dict(local_up_to_layer=1) if family == "convit" else {}
  kwargs = {**TORCH_KWARGS, "img_size": img_size}
  name = f"{family}_tiny" + ("_distilled" if distilled else "")
  return tr.perturb_(tr.build(name, num_classes=num_classes, **kwargs, **extra))


def save(model, path):
  from safetensors.torch import save_file

  save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
  return str(path)


def torch_logits(model, x):
  with torch.no_grad():
    return model.eval()(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()


def images(size=32, batch=2, seed=0):
  return np.random.default_rng(seed).normal(size=(batch, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize(
  "old, new, prefix", [(14, 24, 1), (14, 7, 1), (8, 12, 0), (8, 5, 2), (7, 16, 0)]
)
def test_resample_abs_pos_embed_is_timms(old, new, prefix):
  posemb = np.random.default_rng(old).normal(0, 0.1, (1, prefix + old * old, 16))
  posemb = posemb.astype(np.float32)
  expected = tr.resample_abs_pos_embed(torch.from_numpy(posemb), (new, new), prefix).numpy()
  got = resample_abs_pos_embed(posemb, (new, new), num_prefix_tokens=prefix)
  assert got.dtype == np.float32 and got.shape == expected.shape
  np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family, spec", [("convit", CONVIT), ("deit", DEIT)])
def test_same_classes_and_size_is_the_conversion(tmp_path, family, spec):
  name, overrides = spec
  model_t = reference(family)
  pretrained = load_pretrained(save(model_t, tmp_path / "w.safetensors"), model=name, **overrides)
  assert (pretrained.model, pretrained.num_classes, pretrained.image_size) == (name, 1000, 32)
  assert pretrained.notes == ()
  assert pretrained.label_names == imagenet_class_names()  # 1000 classes: ImageNet's names
  assert pretrained.label_names[:2] == ("tench, Tinca tinca", "goldfish, Carassius auratus")
  x = images()
  logits = pretrained.create_model().apply(pretrained.variables, x)
  np.testing.assert_allclose(logits, torch_logits(model_t, x), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family, spec", [("convit", CONVIT), ("deit", DEIT)])
def test_finetune_at_another_resolution_and_class_count(tmp_path, family, spec):
  name, overrides = spec
  model_t = reference(family)
  path = save(model_t, tmp_path / "w.safetensors")
  tuned = load_pretrained(path, model=name, num_classes=10, img_size=48, **overrides)
  prefix = 0 if family == "convit" else 1
  params = flax.traverse_util.flatten_dict(tuned.variables["params"], sep="/")
  # timm's resample_abs_pos_embed of the 8x8 grid to 12x12.
  expected = tr.resample_abs_pos_embed(model_t.pos_embed.detach(), (12, 12), prefix).numpy()
  np.testing.assert_allclose(params.pop("pos_embed"), expected, atol=1e-6, rtol=0)
  # A fresh head of the new width: the model's own initialisation (zero bias, small weights).
  kernel, bias = params.pop("head/kernel"), params.pop("head/bias")
  assert kernel.shape == (192, 10) and not bias.any() and 0 < kernel.std() < 0.05
  # Everything else is locvit.convert's conversion of the checkpoint.
  converted = from_timm(name, model_t.state_dict(), **overrides)["params"]
  converted = flax.traverse_util.flatten_dict(converted, sep="/")
  assert set(params) == set(converted) - {"pos_embed", "head/kernel", "head/bias"}
  for key, value in params.items():
    np.testing.assert_array_equal(value, converted[key], err_msg=key)
  assert tuned.notes == (
    "pos_embed resampled from a 8x8 to a 12x12 patch grid (32 -> 48 px, bicubic, antialiased)",
    "head re-initialised: the weights have 1000 classes, the model 10",
  )
  assert tuned.label_names is None and tuned.data_config.image_size == 48


def test_gpsa_follows_the_new_grid(tmp_path):
  """ConViT at 48 px from 32 px weights equals the reference ConViT built at 48 px with timm's
  resampled pos_embed: GPSA's positional scores come from the new grid's relative offsets."""
  model_t = reference("convit")
  path = save(model_t, tmp_path / "w.safetensors")
  tuned = load_pretrained(path, img_size=48, model=CONVIT[0], **CONVIT[1])
  at_48 = reference("convit", img_size=48)
  state = dict(model_t.state_dict())
  state["pos_embed"] = tr.resample_abs_pos_embed(model_t.pos_embed.detach(), (12, 12), 0)
  at_48.load_state_dict(state)
  x = images(48)
  logits = tuned.create_model().apply(tuned.variables, x)
  np.testing.assert_allclose(logits, torch_logits(at_48, x), atol=1e-4, rtol=0)


def hub_cache(root, repo: str, files: dict[str, bytes], revision: str = "0123abcd" * 5) -> str:
  """The Hugging Face cache layout: models--ORG--NAME/{refs/main, snapshots/REV/FILES}."""
  folder = root / f"models--{repo.replace('/', '--')}"
  (folder / "refs").mkdir(parents=True)
  (folder / "refs" / "main").write_text(revision)
  snapshot = folder / "snapshots" / revision
  snapshot.mkdir(parents=True)
  for filename, data in files.items():
    (snapshot / filename).write_bytes(data)
  return str(root)


TIMM_CONFIG = {
  "architecture": "convit_tiny",
  "num_classes": 1000,
  "num_features": 192,
  "pretrained_cfg": {
    "tag": "fb_in1k",
    "input_size": [3, 224, 224],
    "fixed_input_size": True,
    "interpolation": "bicubic",
    "crop_pct": 0.875,
    "crop_mode": "center",
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "num_classes": 1000,
    "first_conv": "patch_embed.proj",
    "classifier": "head",
  },
}


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
  model_t = reference("convit")
  path = save(model_t, tmp_path / "w.safetensors")
  config = json.dumps(TIMM_CONFIG).encode()
  with open(path, "rb") as f:
    files = {"config.json": config, "model.safetensors": f.read()}
  cache = hub_cache(tmp_path / "hub", "timm/convit_tiny.fb_in1k", files)
  monkeypatch.setenv("HF_HUB_CACHE", cache)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return path


@pytest.mark.parametrize("name", ["hf-hub:timm/convit_tiny.fb_in1k", "convit_tiny.fb_in1k"])
def test_hub_name_from_the_offline_cache(offline_cache, name):
  from_hub = load_pretrained(name, model=CONVIT[0], **CONVIT[1])
  from_file = load_pretrained(offline_cache, model=CONVIT[0], **CONVIT[1])
  assert from_hub.source.endswith("model.safetensors") and "models--timm--convit_tiny" in (
    from_hub.source
  )
  jax.tree.map(np.testing.assert_array_equal, from_hub.variables, from_file.variables)
  assert from_hub.data_config.crop_pct == 0.875 and from_hub.data_config.interpolation == "bicubic"
  assert from_hub.data_config.image_size == 32  # the model's grid, not the config's 224


def test_bad_inputs_are_one_line(tmp_path, offline_cache, monkeypatch):
  def error(*args, **kwargs) -> str:
    with pytest.raises(WeightsError) as e:
      load_pretrained(*args, **kwargs)
    message = str(e.value)
    assert "\n" not in message
    return message

  missing = str(tmp_path / "nope.safetensors")
  assert error(missing).startswith(f"{missing}: no such file or directory; give a .safetensors")
  assert "hf-hub:timm/nope" in error("timm/nope")
  message = error("hf-hub:timm/deit_tiny_patch16_224.fb_in1k")
  repo = "timm/deit_tiny_patch16_224.fb_in1k"
  assert f"{repo}/config.json is not in the Hugging Face cache" in message
  assert "HF_HUB_OFFLINE=1" in message and "hf download" in message
  deit = save(reference("deit"), tmp_path / "deit.safetensors")
  message = error(deit, model=CONVIT[0], **CONVIT[1])
  assert message.startswith(f"{deit} does not fit convit_tiny_patch4_32: ")
  assert message.endswith(
    "these are DeiT weights (without GPSA gating_param); use a deit_* model, or convit weights"
  )
  # The hub's config names the architecture: a DeiT model asked of ConViT weights.
  message = error("convit_tiny.fb_in1k", model=DEIT[0], **DEIT[1])
  assert "holds convit_tiny weights, which do not fit deit_tiny_patch4_32" in message
  # A pos_embed that is no square grid cannot be resampled.
  state = {k: v.numpy() for k, v in reference("convit").state_dict().items()}
  state["pos_embed"] = state["pos_embed"][:, :60]
  np.savez(tmp_path / "odd.npz", **state)
  message = error(str(tmp_path / "odd.npz"), model=CONVIT[0], **CONVIT[1])
  assert "pos_embed has 60 rows, which is no square patch grid" in message
  assert "patch size 4" in error(offline_cache, model=CONVIT[0], img_size=30, **CONVIT[1])
  with pytest.raises(WeightsError, match="does not say its architecture"):
    resolve_weights(offline_cache) and load_pretrained(offline_cache)


def test_pth_without_torch_names_the_install(tmp_path, monkeypatch):
  import sys

  path = tmp_path / "w.pth"
  torch.save(reference("convit").state_dict(), path)
  monkeypatch.setitem(sys.modules, "torch", None)
  with pytest.raises(WeightsError, match=r"needs PyTorch \(pip install torch\)"):
    load_pretrained(str(path), model=CONVIT[0], **CONVIT[1])


def test_converted_directory(tmp_path):
  from locvit.convert.__main__ import main as convert_main

  model_t = reference("convit")
  path = save(model_t, tmp_path / "w.safetensors")
  out = tmp_path / "flax"
  argv = [f"--model={CONVIT[0]}", f"--input={path}", f"--output={out}"]
  overrides = ["--override=depth=2", "--override=class_token_layer=1"]
  overrides.append("--override=layer_attention=('gpsa', 'mhsa')")
  assert convert_main([*argv, *overrides]) == 0
  tuned = load_pretrained(str(out), num_classes=10, img_size=48)
  direct = load_pretrained(path, model=CONVIT[0], num_classes=10, img_size=48, **CONVIT[1])
  assert tuned.model == CONVIT[0] and tuned.notes == direct.notes
  jax.tree.map(np.testing.assert_array_equal, tuned.variables, direct.variables)
  assert create_model(CONVIT[0], num_classes=10, **CONVIT[1])  # the same model


def torch_heads(model, x):
  """The class and distillation heads' logits of timm's distilled DeiT, apart (its training
  output with ``distilled_training`` on; dropout and drop path are 0)."""
  model.distilled_training = True
  with torch.no_grad():
    logits, dist_logits = model.train()(torch.from_numpy(x).permute(0, 3, 1, 2))
  model.distilled_training = False
  return logits.numpy(), dist_logits.numpy()


def softmax(logits):
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_distilled_deit_evaluates_as_timm(tmp_path):
  """timm's deit_*_distilled_* weights: evaluation is the mean of the two heads' logits
  (VisionTransformerDistilled.forward_head), so is training unless distilled_training returns
  both heads, and distilled_inference='softmax' is the log of the two softmaxes' mean. Logits
  to 1e-4 (float32, as the other conversions here), probabilities to 1e-6."""
  model_t = reference("deit", distilled=True)
  path = save(model_t, tmp_path / "distilled.safetensors")
  pretrained = load_pretrained(path, model=DISTILLED[0], **DISTILLED[1])
  assert pretrained.model == DEIT[0] and pretrained.overrides == {"distilled": True, **DEIT[1]}
  assert pretrained.notes == () and pretrained.num_classes == 1000
  x = images()
  model, variables = pretrained.create_model(), pretrained.variables
  np.testing.assert_allclose(model.apply(variables, x), torch_logits(model_t, x), atol=1e-4, rtol=0)
  expected = torch_heads(model_t, x)
  training = pretrained.create_model(drop_path_rate=0.0, distilled_training=True)  # no drop path
  for got, want in zip(training.apply(variables, x, train=True), expected, strict=True):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  # Fine-tuning without distillation trains on the averaged logits, as timm's training mode does.
  finetuning = pretrained.create_model(drop_path_rate=0.0).apply(variables, x, train=True)
  with torch.no_grad():
    timm_training = model_t.train()(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
  np.testing.assert_allclose(finetuning, timm_training, atol=1e-4, rtol=0)
  log_probs = pretrained.create_model(distilled_inference="softmax").apply(variables, x)
  mean_softmax = (softmax(expected[0]) + softmax(expected[1])) / 2
  np.testing.assert_allclose(np.exp(log_probs), mean_softmax, atol=1e-6, rtol=0)


def test_distilled_deit_finetune_keeps_both_prefix_rows_and_renews_both_heads(tmp_path):
  """timm's fine-tuning of a distilled DeiT: at a new class count both heads start fresh
  (pretrained_cfg classifier=('head', 'head_dist')); at a new resolution pos_embed is resampled
  past both prefix rows (num_prefix_tokens=2), and the model equals timm's built at that size."""
  model_t = reference("deit", distilled=True)
  path = save(model_t, tmp_path / "distilled.safetensors")
  tuned = load_pretrained(path, model=DISTILLED[0], num_classes=10, img_size=48, **DISTILLED[1])
  params = flax.traverse_util.flatten_dict(tuned.variables["params"], sep="/")
  at_48 = tr.resample_abs_pos_embed(model_t.pos_embed.detach(), (12, 12), 2)
  np.testing.assert_allclose(params.pop("pos_embed"), at_48.numpy(), atol=1e-6, rtol=0)
  heads = {key: params.pop(key) for key in sorted(params) if key.startswith("head")}
  assert sorted(heads) == ["head/bias", "head/kernel", "head_dist/bias", "head_dist/kernel"]
  for head in ("head", "head_dist"):  # the model's own initialisation
    kernel, bias = heads[f"{head}/kernel"], heads[f"{head}/bias"]
    assert kernel.shape == (192, 10) and not bias.any() and 0 < kernel.std() < 0.05
  assert not np.array_equal(heads["head/kernel"], heads["head_dist/kernel"])
  converted = from_timm(DISTILLED[0], model_t.state_dict(), **DISTILLED[1])["params"]
  converted = flax.traverse_util.flatten_dict(converted, sep="/")
  assert set(params) == set(converted) - {"pos_embed", *heads}
  assert "dist_token" in params and "cls_token" in params
  for key, value in params.items():
    np.testing.assert_array_equal(value, converted[key], err_msg=key)
  assert tuned.notes == (
    "pos_embed resampled from a 8x8 to a 12x12 patch grid (32 -> 48 px, bicubic, antialiased)",
    "head and head_dist re-initialised: the weights have 1000 classes, the model 10",
  )
  # timm's model at 48 px and 10 classes, given the same fresh heads: the same function.
  timm_48 = reference("deit", num_classes=10, img_size=48, distilled=True)
  fresh = {
    f"{h}.{p}": torch.from_numpy(heads[f"{h}/{f}"].T.copy())
    for h in ("head", "head_dist")
    for p, f in (("weight", "kernel"), ("bias", "bias"))
  }
  timm_48.load_state_dict({**model_t.state_dict(), "pos_embed": at_48, **fresh})
  x = images(48)
  logits = tuned.create_model().apply(tuned.variables, x)
  np.testing.assert_allclose(logits, torch_logits(timm_48, x), atol=1e-4, rtol=0)


def test_distilled_deit_converted_under_its_timm_name(tmp_path):
  """python -m locvit.convert --model=deit_tiny_distilled_patch4_32 (timm's name) writes a
  distilled DeiT, which load_pretrained reads back as the weights file itself."""
  from locvit.convert.__main__ import main as convert_main

  path = save(reference("deit", distilled=True), tmp_path / "distilled.safetensors")
  out = tmp_path / "flax"
  argv = [f"--model={DISTILLED[0]}", f"--input={path}", f"--output={out}", "--override=depth=2"]
  assert convert_main(argv) == 0
  converted = load_pretrained(str(out))
  direct = load_pretrained(path, model=DISTILLED[0], **DISTILLED[1])
  assert converted.model == direct.model == DEIT[0]
  assert converted.overrides == direct.overrides == {"distilled": True, "depth": 2}
  jax.tree.map(np.testing.assert_array_equal, converted.variables, direct.variables)


def test_distilled_and_plain_weights_are_not_mistaken(tmp_path):
  """Distilled DeiT weights for a plain DeiT, and plain ones for a distilled DeiT: one line naming
  the way out, not pos_embed's row count read with the other prefix count."""
  distilled = save(reference("deit", distilled=True), tmp_path / "distilled.safetensors")
  with pytest.raises(WeightsError) as e:
    load_pretrained(distilled, model=DEIT[0], **DEIT[1])
  assert str(e.value) == (
    f"{distilled} does not fit {DEIT[0]}: these are distilled DeiT weights (dist_token, "
    "head_dist); give --config.model.overrides.distilled=True (distilled=True), or weights "
    "without a distillation token"
  )
  plain = save(reference("deit"), tmp_path / "plain.safetensors")
  with pytest.raises(WeightsError) as e:
    load_pretrained(plain, model=DISTILLED[0], **DISTILLED[1])
  assert str(e.value) == (
    f"{plain} does not fit {DEIT[0]} with a distillation token (distilled=True, or distillation "
    "on): these weights have none; give distilled DeiT weights (deit_*_distilled_*)"
  )


@pytest.mark.parametrize("path", ["/missing", "./missing", "~/missing"])
def test_a_missing_path_is_not_taken_for_a_hub_repository(path):
  with pytest.raises(WeightsError) as e:
    resolve_weights(path)
  assert str(e.value).startswith(f"{path}: no such file or directory; give a .safetensors")
