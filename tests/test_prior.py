"""A locality prior added to a pretrained plain ViT (``locvit.convert.prior``): the new model's
logits equal the source's where the math allows (to 1e-5: the masked and gated layers run other
attention kernels), only the prior's parameters differ from the source's, and the approximate
starts say why."""

import flax
import jax
import numpy as np
import pytest

from locvit.configs.defaults import convit_layers
from locvit.convert import expected_state_dict_shapes, from_timm
from locvit.convert.prior import CLOSED_GATE, PriorError, add_locality_prior
from locvit.models import create_model

EXACT = 1e-5
TOY = dict(num_classes=5, depth=3, embed_dim=64, num_heads=4)


def _model(**overrides):
  return create_model("deit_tiny_patch4_32", **(TOY | overrides))


def _images(size=32):
  return jax.random.normal(jax.random.key(1), (2, size, size, 3))


def _with_prior(source_overrides, target_overrides, size=32, **kwargs):
  """(source logits, new logits, source params, new params, report)."""
  images = _images(size)
  source_model, model = _model(**source_overrides), _model(**target_overrides)
  source = source_model.init(jax.random.key(0), images)
  variables, report = add_locality_prior(
    source, model.init(jax.random.key(2), images), model, image_size=size, **kwargs
  )
  logits = model.apply(variables, images)
  return source_model.apply(source, images), logits, source, variables, report


def _flat(variables):
  return flax.traverse_util.flatten_dict(flax.linen.meta.unbox(variables["params"]), sep="/")


MASKED = {
  "elm multiply": {"layer_attention": ("elm",) * 3},
  "elm add": {"layer_attention": ("elm",) * 3, "attention_kwargs": {"elm": {"combine": "add"}}},
  "gmm multiply faithful 8x8": {"layer_attention": ("gmm", "gmm", "mhsa")},
  "gmm multiply intended": {
    "layer_attention": ("gmm",) * 3,
    "attention_kwargs": {"gmm": {"kernel": "intended"}},
  },
  "gmm add": {"layer_attention": ("gmm",) * 3, "attention_kwargs": {"gmm": {"combine": "add"}}},
}


@pytest.mark.parametrize("target", MASKED.values(), ids=MASKED.keys())
def test_a_masked_vit_from_a_deit_computes_the_deits_logits(target):
  expected, logits, source, variables, report = _with_prior({}, target)
  assert report.exact, report.summary()
  np.testing.assert_allclose(logits, expected, atol=EXACT, rtol=0)
  src, new = _flat(source), _flat(variables)
  assert set(new) - set(src) == set(report.fresh) and all("/mask/" in k for k in report.fresh)
  for key, value in src.items():
    np.testing.assert_array_equal(new[key], value, err_msg=key)


def test_gmm_multiply_keeps_a_learnable_prior_beside_its_flat_kernel():
  *_, variables, _ = _with_prior({}, MASKED["gmm multiply intended"])
  alpha = _flat(variables)["blocks_0/attn/mask/alpha"]
  sigma = _flat(variables)["blocks_0/attn/mask/sigma"]
  flat_kernel_only = np.zeros((5, 4), np.float32)
  flat_kernel_only[0] = 1.0
  np.testing.assert_array_equal(alpha, flat_kernel_only)
  assert sigma[0, 0] == np.float32(1e15)
  assert np.all(np.abs(sigma[1:] - 10.0) < 60.0)  # the fresh N(10, 10^2) init


def test_faithful_gmm_on_a_large_grid_is_an_approximate_start_that_says_where():
  """10x10 patches: the official base underflows to 0 at d^2 >= 104 (e.g. 9 rows and 5 columns
  apart), so those logits become 0."""
  *_, report = _with_prior({}, {"layer_attention": ("gmm",) * 3}, size=40)
  assert not report.exact
  (note,) = report.approximations
  assert "underflow to 0 on 180 of 10000 query-key pairs of the 10x10 grid" in note, note


@pytest.mark.parametrize("kind", ["gpsa", "psa"])
def test_gpsa_and_psa_from_a_pooled_vit_are_exact_with_a_closed_gate(kind):
  """Without a class token, GPSA with sigmoid(gate) = 0 (and PSA with zero positional logits)
  compute the source's attention; qk and v are the source's qkv split."""
  pooled = {"pool": "gap"}
  target = pooled | {"layer_attention": (kind, kind, "mhsa")}
  expected, logits, source, variables, report = _with_prior(pooled, target, gate_logit=CLOSED_GATE)
  assert report.exact, report.summary()
  np.testing.assert_allclose(logits, expected, atol=EXACT, rtol=0)
  src, new = _flat(source), _flat(variables)
  qkv = src["blocks_1/attn/qkv/kernel"]
  np.testing.assert_array_equal(new["blocks_1/attn/qk/kernel"], qkv[:, :2])
  np.testing.assert_array_equal(new["blocks_1/attn/v/kernel"], qkv[:, 2])
  np.testing.assert_array_equal(new["blocks_1/attn/v/bias"], src["blocks_1/attn/qkv/bias"][2])


def test_the_default_gate_is_a_bounded_approximate_start():
  pooled = {"pool": "gap"}
  target = pooled | {"layer_attention": ("gpsa", "gpsa", "mhsa")}
  expected, logits, *_, variables, report = _with_prior(pooled, target)
  (note,) = report.approximations
  assert note.startswith("GPSA gates at sigmoid(-10) = 4.54e-05 on position"), note
  assert "within 9.1e-05 in L1" in note
  np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)
  assert np.all(_flat(variables)["blocks_0/attn/gating_param"] == -10.0)


def test_a_convit_from_a_class_token_deit_is_approximate_and_moves_the_tokens_position():
  target = {"layer_attention": convit_layers(2, 3), "class_token_layer": 2}
  _, _, source, variables, report = _with_prior({}, target, gate_logit=CLOSED_GATE)
  (note,) = report.approximations
  assert "the class token joins at block 2" in note and "no longer attend to it" in note
  src, new = _flat(source), _flat(variables)
  np.testing.assert_array_equal(new["pos_embed"], src["pos_embed"][:, 1:])
  np.testing.assert_array_equal(new["cls_token"], src["cls_token"] + src["pos_embed"][:, :1])
  assert "locality prior added to the pretrained weights: 2 gpsa, 1 mhsa layers" in report.summary()


def test_what_does_not_fit_is_listed_in_one_error():
  images = _images()
  source = _model(pool="gap").init(jax.random.key(0), images)  # qkv biases, 5 classes
  model = _model(
    pool="gap", num_classes=7, qkv_bias=False, layer_attention=("quadratic", "elm", "elm")
  )
  with pytest.raises(PriorError) as error:
    add_locality_prior(source, model.init(jax.random.key(2), images), model, image_size=32)
  message = str(error.value)
  assert "blocks_0: attention kind 'quadratic' has no function-preserving prior" in message
  assert "head/kernel: source parameter has shape (64, 5), the model (64, 7)" in message
  assert "blocks_1/attn/qkv/bias: in the source, no place in the model" in message
  assert "(the source has qkv biases: build the model with qkv_bias=True)" in message


def _weights_file(tmp_path):
  """A timm-named DeiT (2 blocks, 32 px, patch 4, 5 classes) as a .npz, random values."""
  shapes = expected_state_dict_shapes("deit_tiny_patch4_32", num_classes=5, **TOY_FILE)
  rng = np.random.default_rng(0)
  state = {k: rng.normal(0, 0.2, s).astype(np.float32) for k, s in shapes.items()}
  np.savez(tmp_path / "deit.npz", **state)
  return str(tmp_path / "deit.npz"), state


TOY_FILE = dict(depth=2, embed_dim=64, num_heads=4)


@pytest.mark.parametrize(
  "overrides, summary",
  [
    (
      {"layer_attention": ("elm", "elm")},
      "2 elm layers, 2 prior parameters new, the rest copied; exact start",
    ),
    (
      {"layer_attention": ("gpsa", "mhsa"), "class_token_layer": 1},
      "1 gpsa, 1 mhsa layers, 3 prior parameters new, the rest copied; approximate start: the "
      "class token joins at block 1",
    ),
  ],
  ids=["elm", "gpsa"],
)
def test_a_run_adds_the_prior_to_weights_it_is_given(tmp_path, caplog, overrides, summary):
  """``init_from.weights`` of a plain DeiT, ``model.name`` that DeiT with the prior's overrides and
  ``init_from.add_prior``: the run starts from ``add_locality_prior`` of the converted weights,
  and says so in one line."""
  from locvit.configs.common import base_config
  from locvit.run.bundle import weights_warmstart

  path, state = _weights_file(tmp_path)
  config = base_config()
  config.model.name = "deit_tiny_patch4_32"
  config.model.overrides.update(TOY_FILE | overrides)
  config.data.image_size = 32
  config.init_from.weights, config.init_from.add_prior = path, True
  with caplog.at_level("WARNING"):
    warm = weights_warmstart(config, 5)
  (line,) = [r.getMessage() for r in caplog.records if "add_prior" in r.getMessage()]
  assert line.startswith("init_from.add_prior: locality prior added to the pretrained weights: ")
  assert summary in line, line
  source = from_timm("deit_tiny_patch4_32", state, num_classes=5, **TOY_FILE)
  expected, _ = add_locality_prior(
    source,
    _model(**TOY_FILE | overrides).init(jax.random.key(0), _images()),
    _model(**TOY_FILE | overrides),
    image_size=32,
  )
  fresh_keys = [k for k in _flat(expected) if "/mask/" in k or "pos_proj" in k]
  for key, value in _flat(expected).items():
    if key not in fresh_keys:  # the prior's fresh values come from the run's key
      np.testing.assert_array_equal(_flat({"params": warm.params})[key], value, err_msg=key)
  if "elm" in overrides["layer_attention"]:
    model = _model(**TOY_FILE | overrides)
    logits = model.apply({"params": warm.params}, _images())
    plain = _model(**TOY_FILE).apply(source, _images())
    np.testing.assert_allclose(logits, plain, atol=EXACT, rtol=0)
