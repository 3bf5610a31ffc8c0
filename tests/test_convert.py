"""timm -> Flax conversion: logit parity with a PyTorch reference, strict key checks, the CLI."""

from __future__ import annotations

import re
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locvit.convert import (
  ConversionError,
  expected_state_dict_shapes,
  from_timm,
  load_converted,
  load_pretrained,
  read_state_dict,
  resolve_model_name,
  supported_models,
)
from locvit.convert.__main__ import main as cli_main
from locvit.models import create_model
from locvit.models.convit import convit_overrides


@pytest.fixture(scope="module")
def tr():
  pytest.importorskip("torch")
  from benchmarks import torch_reference

  return torch_reference


def images(size=224, batch=2, seed=0):
  return np.random.default_rng(seed).normal(size=(batch, size, size, 3)).astype(np.float32)


def torch_logits(model, x):
  import torch

  with torch.no_grad():
    return model.eval()(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()


def reference(tr, name, seed=0, **kwargs):
  import torch

  torch.manual_seed(seed)
  return tr.perturb_(tr.build(name, **kwargs), seed=seed)


@pytest.mark.parametrize("name", ["convit_tiny", "deit_tiny"])
def test_full_size_logits_match_torch_reference(tr, name):
  model_t = reference(tr, name)
  x = images()
  variables = from_timm(name, model_t.state_dict())
  logits = jax.jit(create_model(name).apply)(variables, x)
  np.testing.assert_allclose(logits, torch_logits(model_t, x), atol=1e-4, rtol=0)


def test_reduced_convit_small_with_overrides(tr):
  # 9 heads (odd kernel), 2 GPSA + 1 MHSA layers, CIFAR-size grid: the same rules apply.
  model_t = reference(tr, "convit_small", depth=3, local_up_to_layer=2, img_size=32, patch_size=4)
  model_t.head = type(model_t.head)(432, 10)
  overrides = dict(num_classes=10, **convit_overrides(local_up_to_layer=2, depth=3))
  variables = from_timm("convit_small_patch4_32", model_t.state_dict(), **overrides)
  x = images(32)
  logits = create_model("convit_small_patch4_32", **overrides).apply(variables, x)
  np.testing.assert_allclose(logits, torch_logits(model_t, x), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
  "name", ["convit_tiny", "convit_small", "convit_base", "deit_tiny", "deit_small", "deit_base"]
)
def test_full_size_key_sets_and_shapes(tr, name):
  import torch

  with torch.device("meta"):  # shapes only, no allocation
    state = tr.build(name).state_dict()
  assert {k: tuple(v.shape) for k, v in state.items()} == expected_state_dict_shapes(name)


def test_converted_shapes_match_model_init():
  # NumPy input, no torch needed.
  shapes = expected_state_dict_shapes("convit_tiny")
  state = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
  params = from_timm("convit_tiny", state)["params"]
  model = create_model("convit_tiny")
  abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))
  expected = flax.linen.meta.unbox(abstract)["params"]
  assert jax.tree.map(lambda a: a.shape, params) == jax.tree.map(lambda a: a.shape, expected)
  assert params["blocks_0"]["attn"]["qk"]["kernel"].shape == (192, 2, 4, 48)
  assert params["blocks_11"]["attn"]["qkv"]["kernel"].shape == (192, 3, 4, 48)


def test_bad_state_dict_lists_every_problem():
  shapes = expected_state_dict_shapes("convit_tiny")
  state = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
  del state["blocks.3.attn.gating_param"], state["norm.weight"]
  state["blocks.0.attn.qkv.weight"] = np.zeros((576, 192))
  state["dist_token"] = np.zeros((1, 1, 192))
  state["blocks.2.attn.pos_proj.weight"] = np.zeros((3, 4))
  state["head.weight"] = np.zeros((10, 192))
  with pytest.raises(ConversionError) as info:
    from_timm("convit_tiny", state)
  message = str(info.value)
  for expected in [
    "2 missing key(s)",
    "blocks.3.attn.gating_param: expected (4,)",
    "norm.weight: expected (192,)",
    "2 unexpected key(s)",
    "blocks.0.attn.qkv.weight: shape (576, 192)",
    "dist_token: shape (1, 1, 192)",
    "2 mis-shaped key(s)",
    "blocks.2.attn.pos_proj.weight: expected (4, 3), got (3, 4)",
    "head.weight: expected (1000, 192), got (10, 192)",
    "num_classes",
  ]:
    assert expected in message, (expected, message)


def test_model_names():
  assert {"convit_tiny", "convit_base", "deit_small"} <= set(supported_models())
  assert resolve_model_name("deit_tiny_patch16_224.fb_in1k") == "deit_tiny_patch16_224"
  assert resolve_model_name("convit_small.fb_in1k") == "convit_small"
  with pytest.raises(ValueError, match=re.escape("Supported: [")) as info:
    from_timm("resnet50", {})
  assert "convit_tiny" in str(info.value)


def test_bfloat16_torch_tensors(tr):
  import torch

  model_t = reference(tr, "deit_tiny", depth=1, img_size=32, patch_size=4)
  state = {k: v.to(torch.bfloat16) for k, v in model_t.state_dict().items()}
  params = from_timm("deit_tiny_patch4_32", state, depth=1)["params"]
  assert params["head"]["kernel"].dtype == jnp.float32
  np.testing.assert_array_equal(params["head"]["bias"], state["head.bias"].float().numpy())


def test_cli_round_trip(tr, tmp_path, capsys):
  import torch

  model_t = reference(tr, "convit_tiny", seed=1)
  weights = tmp_path / "convit_tiny.pth"
  torch.save({"model": model_t.state_dict(), "epoch": 299}, weights)  # official wrapper
  out = tmp_path / "flax"
  assert cli_main(["--model=convit_tiny", f"--input={weights}", f"--output={out}"]) == 0
  assert "Wrote convit_tiny" in capsys.readouterr().out
  variables = load_converted(out)
  x = images(seed=1)
  logits = jax.jit(create_model("convit_tiny").apply)(variables, x)
  np.testing.assert_allclose(logits, torch_logits(model_t, x), atol=1e-4, rtol=0)
  # Existing output needs --force; a mismatched model fails with the key report.
  assert cli_main(["--model=convit_tiny", f"--input={weights}", f"--output={out}"]) == 2
  assert "--force" in capsys.readouterr().err
  assert cli_main(["--model=deit_tiny", f"--input={weights}", f"--output={tmp_path / 'x'}"]) == 2
  assert "missing key(s)" in capsys.readouterr().err
  assert cli_main(["--model=convit_tinyy", f"--input={weights}", f"--output={tmp_path / 'z'}"]) == 2
  assert capsys.readouterr().err == (
    "locvit.convert: error: Cannot convert 'convit_tinyy': not a supported model; did you mean "
    f"convit_tiny? Supported: {supported_models()}.\n"
  )


def test_cli_errors_are_one_line_with_exit_status_2(tmp_path, capsys):
  """As locvit.main's: the error line, exit 2, nothing written (no PyTorch needed)."""
  existing = tmp_path / "flax"
  existing.mkdir()
  argv = ["--model=convit_tiny", f"--input={tmp_path / 'weights.pth'}"]
  assert cli_main([*argv, f"--output={existing}"]) == 2
  assert capsys.readouterr() == (
    "",
    f"locvit.convert: error: {existing} already exists (pass --force to overwrite).\n",
  )
  assert cli_main([*argv, f"--output={tmp_path / 'new'}"]) == 2  # the missing input
  assert capsys.readouterr().err == (
    f"locvit.convert: error: [Errno 2] No such file or directory: '{tmp_path / 'weights.pth'}'\n"
  )
  assert sorted(p.name for p in tmp_path.iterdir()) == ["flax"]


def test_safetensors_without_package(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "safetensors", None)
  monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
  with pytest.raises(ImportError, match="pip install safetensors"):
    read_state_dict(tmp_path / "weights.safetensors")


def test_cli_npz_input_and_overrides(tr, tmp_path, capsys):
  model_t = reference(tr, "deit_tiny", depth=1, img_size=32, patch_size=4)
  weights = tmp_path / "deit.npz"
  np.savez(weights, **{k: v.numpy() for k, v in model_t.state_dict().items()})
  out = tmp_path / "flax"
  argv = ["--model=deit_tiny_patch4_32", f"--input={weights}", f"--output={out}"]
  assert cli_main([*argv, "--override", "depth=1"]) == 0
  x = images(seed=2, size=32)
  logits = create_model("deit_tiny_patch4_32", depth=1).apply(load_converted(out), x)
  np.testing.assert_allclose(logits, torch_logits(model_t, x), atol=1e-4, rtol=0)
  # Without the override the key report names the missing blocks; a malformed override fails.
  assert cli_main([*argv[:2], f"--output={tmp_path / 'y'}"]) == 2
  assert "missing key(s)" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli_main([*argv, "--override", "depth"])
  assert "must look like FIELD=VALUE" in capsys.readouterr().err
  with pytest.raises(SystemExit):  # was create_model's TypeError: multiple values
    cli_main([*argv, "--override", "num_classes=3"])
  assert capsys.readouterr().err.endswith(
    "--override 'num_classes=3': give the class count as --num_classes\n"
  )
  argv[2] = f"--output={tmp_path / 'z'}"
  assert cli_main([*argv, "--override", "qkv_bias=maybe"]) == 2  # read by the field's type
  assert capsys.readouterr().err == (
    "locvit.convert: error: model.overrides.qkv_bias=maybe: deit_tiny_patch4_32's qkv_bias takes "
    "a bool (true or false, 1 or 0)\n"
  )


def test_cli_writes_a_locvit_runs_weights(tmp_path, capsys):
  """``--workdir=RUN``: the run's parameters, model name, overrides and class count."""
  from locvit import train
  from locvit.models.factory import build_model
  from locvit.workdir import restore
  from tests.test_dataset_choice import folder_config, image_folder
  from tests.train_utils import tiny_config

  workdir = str(tmp_path / "run")
  root = image_folder(tmp_path / "rgb", {s: {"a": 4, "b": 4} for s in ("train", "test")})
  config = tiny_config(total_steps=1, data=folder_config(root), batch_size=8)
  train.train_and_evaluate(config, workdir)
  capsys.readouterr()
  out = tmp_path / "weights"
  assert cli_main([f"--workdir={workdir}", f"--output={out}"]) == 0
  assert capsys.readouterr().out == f"Wrote deit_tiny_patch2_32 (num_classes=2) to {out}\n"
  model = build_model(config, 2)
  params, _, step = restore.restore_model_variables(workdir, model, (8, 8, 3))
  written = load_converted(out)["params"]
  jax.tree.map(np.testing.assert_array_equal, written, jax.device_get(params))
  assert step == 1
  data = load_pretrained(str(out)).data_config  # predict and eval read images as the run did
  assert (data.input_size, data.mean, data.std) == ((3, 8, 8), config.data.mean, config.data.std)
  assert (data.crop_pct, data.interpolation) == (1.0, "bicubic")
  assert cli_main([f"--workdir={tmp_path / 'none'}", f"--output={tmp_path / 'w2'}"]) == 2
  assert capsys.readouterr().err.startswith("locvit.convert: error: ")
  assert not (tmp_path / "w2").exists()
  assert cli_main([f"--workdir={workdir}", "--model=deit_tiny", f"--output={out}2"]) == 2
  assert "give --model and --input (a timm state dict), or --workdir" in capsys.readouterr().err


def test_cli_writes_a_grayscale_runs_weights(tmp_path, capsys):
  """``--workdir=RUN`` of a one-channel run (the digits quickstart) restores with the run's
  channel count, not RGB's."""
  from locvit import train
  from locvit.run.predict import with_weights
  from tests.train_utils import tiny_config

  workdir = str(tmp_path / "run")
  train.train_and_evaluate(tiny_config(total_steps=1), workdir)
  capsys.readouterr()
  out = tmp_path / "weights"
  assert cli_main([f"--workdir={workdir}", f"--output={out}"]) == 0
  assert load_converted(out)["params"]["patch_embed"]["proj"]["kernel"].shape == (2, 2, 1, 32)
  pretrained = load_pretrained(str(out))
  assert pretrained.data_config.input_size == (1, 8, 8)
  with pytest.raises(ValueError) as raised:  # one line from --mode=predict, not Flax's shape error
    with_weights(tiny_config(), pretrained)
  assert str(raised.value) == (
    f"{out}: weights for 1-channel images; --mode=eval and --mode=predict read image folders as "
    "RGB, so give weights trained on RGB images"
  )
