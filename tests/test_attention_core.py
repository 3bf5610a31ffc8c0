"""Every registered backbone reaches the fused kernel wherever its attention math allows it.

One representative per family (model class x attention kinds), traced only (``jax.eval_shape``,
no compilation), with ``attention_implementation='xla'``. ``jax.nn.dot_product_attention`` is
wrapped to count its calls during tracing; the attention layers are counted from the maps they
sow when intermediates are collected (which forces the explicit path). Layers whose math has no
fused form (multiply masks, CaiT's talking heads, positional-only attention) must not call it.
"""

import dataclasses
import functools
import os
import subprocess
import sys

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_dataset_choice import image_folder

from configs.common import base_config
from locvit.attention import (
  GPSA,
  Attention,
  LogitsHook,
  QuadraticPositional,
  Term,
  TokenGrid,
  attend,
)
from locvit.attention.softmax_attention import (
  cudnn_refusal,
  cudnn_rules_only,
  dot_product_attention,
)
from locvit.models import create_model, default_image_size, list_models
from locvit.models.cait import TalkingHeadsAttention
from locvit.models.factory import build_model
from locvit.workdir import fingerprint


def _family(name: str) -> tuple:
  model = create_model(name, num_classes=10)
  kinds = getattr(model, "layer_attention", None) or (getattr(model, "attention", "mhsa"),)
  return type(model).__name__, tuple(sorted(set(kinds))), getattr(model, "content", None)


def _representatives() -> list[str]:
  chosen: dict[tuple, str] = {}
  for name in list_models():
    chosen.setdefault(_family(name), name)
  return sorted(chosen.values())


def _variants() -> list[tuple[str, str]]:
  """(model, combine) for every family; masked families also with the fusable 'add' rule."""
  out = []
  for name in _representatives():
    out.append((name, "multiply"))
    if name.startswith(("gmm_", "elm_")):
      out.append((name, "add"))
  return out


def _fusable(model, combine: str) -> bool:
  """Whether the attention math of ``model`` has a fused form (docs/architecture.md's table)."""
  if type(model).__name__ == "CaiT":
    return False  # talking heads mix heads before and after the softmax
  if getattr(model, "attention", None) in (
    "quadratic",
    "quadratic_generalized",
    "learned_relative",
  ):
    return bool(model.content)  # positional-only attention has no content logits to fuse
  kinds = set(getattr(model, "layer_attention", None) or (getattr(model, "attention", "mhsa"),))
  return not (kinds & {"gmm", "elm"}) or combine == "add"


def _shallow(model) -> dict:
  """Overrides that keep every kind of layer of ``model`` but fewer of them (faster tracing)."""
  fields = {f.name for f in dataclasses.fields(model)}
  if "depths" in fields:
    return {"depths": (2,) * len(model.depths)}  # a shifted Swin block needs two per stage
  out = {"depth": 2}
  if getattr(model, "layer_attention", None):
    out["layer_attention"] = (model.layer_attention[0], model.layer_attention[-1])
  if "class_token_layer" in fields:
    out["class_token_layer"] = min(model.class_token_layer, 1)
  return out


@pytest.fixture
def fused_calls(monkeypatch):
  calls = []
  original = jax.nn.dot_product_attention

  def counting(*args, **kwargs):
    calls.append(kwargs.get("implementation"))
    return original(*args, **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", counting)
  return calls


@pytest.mark.parametrize("name, combine", _variants())
def test_every_fusable_attention_layer_uses_dot_product_attention(name, combine, fused_calls):
  model = create_model(name, num_classes=10)
  if not hasattr(model, "attention_implementation"):
    pytest.skip(f"{name} has no attention")
  overrides = {"attention_implementation": "xla", **_shallow(model)}
  kind = getattr(model, "attention", None) or (model.layer_attention or ("mhsa",))[0]
  if kind in ("gmm", "elm"):
    overrides["attention_kwargs"] = {kind: {"combine": combine}}
  model = create_model(name, num_classes=10, **overrides)
  size = default_image_size(name)
  images = jax.ShapeDtypeStruct((2, size, size, 3), jnp.float32)
  variables = jax.eval_shape(model.init, jax.random.key(0), images)
  fused_calls.clear()  # init does not collect intermediates, so it runs the fused path too

  _, state = jax.eval_shape(
    functools.partial(model.apply, mutable=["intermediates"]), variables, images
  )
  paths = flax.traverse_util.flatten_dict(state["intermediates"], sep="/")
  layers = [p for p in paths if p.endswith("/attention")]
  assert layers, f"{name}: no attention layer sowed its map"
  assert not fused_calls  # collecting maps materialises them

  jax.eval_shape(model.apply, variables, images)
  expected = len(layers) if _fusable(model, combine) else 0
  assert len(fused_calls) == expected, (name, combine, len(fused_calls), layers)
  assert set(fused_calls) <= {"xla"}


def test_create_model_resolves_the_kernel_setting_once():
  assert jax.default_backend() == "cpu"
  assert create_model("pit_smalldata_patch2_32").attention_implementation == "cpu_kernels"
  model = create_model("swin_smalldata_patch2_32", attention_implementation="cudnn")
  assert model.attention_implementation == "cudnn"
  with pytest.raises(ValueError, match=r"implementation='flash' is not one of"):
    create_model("t2t_smalldata_32", attention_implementation="flash")


def test_the_config_chooses_the_kernels_from_the_command_line():
  """``--config.attention_implementation=cudnn`` (README): one top-level field, outside the model
  block, so that it is not part of a checkpoint's fingerprint."""
  config = base_config()
  config.model.name = "convit_tiny"
  assert build_model(config, 10).attention_implementation == "cpu_kernels"  # None, resolved on CPU
  config.attention_implementation = "cudnn"
  assert build_model(config, 10).attention_implementation == "cudnn"
  assert "attention_implementation" not in fingerprint.fingerprint(config, 10)["model"]


ODD_LENGTH = (
  "attention_implementation='cudnn': cuDNN's fused attention cannot take sequence length 65 with "
  "a bias in training (it needs even lengths); use attention_implementation='xla' or None (JAX's "
  "choice: XLA)"
)
FLOAT32 = (
  "attention_implementation='cudnn': cuDNN's fused attention cannot take float32 inputs (it needs "
  "bfloat16 or float16: mixed precision); use attention_implementation='xla' or None (JAX's "
  "choice: XLA)"
)


def test_cudnn_rules_are_shape_logic():
  """JAX's rules for cuDNN's fused attention (docs/architecture.md), checked on CPU."""
  bf16 = jnp.bfloat16
  assert cudnn_refusal(65, 65, 16, bf16, training=True) == ODD_LENGTH
  assert cudnn_refusal(65, 65, 16, bf16, training=False) is None  # the forward pass takes it
  assert cudnn_refusal(65, 65, 16, bf16, bias=False) is None  # padded to 66 (next test)
  assert cudnn_refusal(64, 64, 16, bf16) is None and cudnn_refusal(196, 196, 256, "float16") is None
  assert "sequence length 1 (queries) x 197 (keys) with a bias" in cudnn_refusal(1, 197, 64, bf16)
  assert "head dim 12 (it needs a multiple of 8, at most 256" in cudnn_refusal(64, 64, 12, bf16)
  assert cudnn_refusal(64, 64, 8, jnp.float32) == FLOAT32


@pytest.mark.parametrize("queries, keys", [(65, 65), (1, 197)])
def test_cudnn_trains_odd_lengths_padded_to_even_ones_with_the_same_result(queries, keys):
  """Without a bias, 'cudnn' trains 65 (ViT d9) or 197 (DeiT) tokens as 66 or 198 with the padded
  key masked by the lengths: outputs and gradients are the unpadded attention's. Run through XLA's
  kernel with the same arguments (``cudnn_rules_only``: any host)."""
  keys_q, keys_k, keys_v = jax.random.split(jax.random.key(3), 3)
  q = jax.random.normal(keys_q, (2, queries, 3, 16), jnp.bfloat16)
  k, v = (jax.random.normal(key, (2, keys, 3, 16), jnp.bfloat16) for key in (keys_k, keys_v))

  def loss(implementation, q, k, v):
    out = dot_product_attention(q, k, v, implementation=implementation, scale=0.3)
    weights = jnp.arange(out.size).reshape(out.shape) % 7  # a cotangent that differs by position
    return jnp.sum(out.astype(jnp.float32) * weights), out

  with cudnn_rules_only():
    grads_padded, padded = jax.grad(functools.partial(loss, "cudnn"), (0, 1, 2), has_aux=True)(
      q, k, v
    )
  grads_plain, plain = jax.grad(functools.partial(loss, "xla"), (0, 1, 2), has_aux=True)(q, k, v)
  assert padded.shape == plain.shape == (2, queries, 3, 16)
  for a, b in zip((padded, *grads_padded), (plain, *grads_plain), strict=True):
    np.testing.assert_array_equal(a, b)  # bit for bit: the padded key adds exp(-inf) = 0


def test_a_cudnn_layer_refuses_a_shape_cudnn_cannot_train_when_traced():
  """Trace time, for users of the Flax modules: the same line as the config check, raised before
  JAX's kernel is called (an additive bias at an odd length); the forward pass of the same shape,
  and training without the bias (padded), are let through."""
  layer = Attention(num_heads=2, implementation="cudnn", dtype=jnp.bfloat16)
  tokens = lambda n: jax.ShapeDtypeStruct((2, n, 32), jnp.bfloat16)
  bias = lambda n: (Term(jnp.zeros((1, 2, n, n), jnp.bfloat16), "add"),)
  init = lambda n, train, terms=(): jax.eval_shape(
    lambda x: layer.init(jax.random.key(0), x, train=train, terms=terms), tokens(n)
  )
  with pytest.raises(ValueError) as refused:
    init(65, True, bias(65))
  assert str(refused.value) == ODD_LENGTH
  with cudnn_rules_only():  # XLA's kernel in cuDNN's place once the rules pass: any host
    init(65, False, bias(65))
    init(65, True)
    init(64, True, bias(64))


def test_the_command_line_refuses_cudnn_for_float32_before_anything_runs(tmp_path):
  """The GMM paper's ViT baseline without mixed precision: one ``locvit: error:`` line, exit 2,
  before the workdir is created or anything compiled."""
  split = {f"c{i}": 1 for i in range(10)}
  image_folder(tmp_path / "data", {"train": split, "test": split}, side=32)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [
    *(sys.executable, "-m", "locvit.main", "--config=gmm_table1:vit,cifar10,base"),
    f"--data={tmp_path / 'data'}",
    f"--workdir={tmp_path / 'run'}",
    "--config.attention_implementation=cudnn",
    "--config.mixed_precision=False",
  ]
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
  assert (proc.returncode, proc.stderr) == (2, f"locvit: error: {FLOAT32}\n"), proc.stderr
  assert not (tmp_path / "run").exists()


def test_logits_hook_and_terms_compose_in_order():
  """Explicit path: ``hook.after(softmax(hook.before(q k^T s * M + B)))`` against NumPy."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 4, 3, 5)), jnp.float32) for _ in range(3))
  mask, bias = (jnp.asarray(rng.normal(size=(3, 4, 4)), jnp.float32) for _ in range(2))
  mix = jnp.asarray(rng.normal(size=(3, 3)), jnp.float32)
  hook = LogitsHook(lambda x: jnp.einsum("bhnm,hg->bgnm", x, mix), lambda p: 2.0 * p)

  class Layer(flax.linen.Module):
    @flax.linen.compact
    def __call__(self, q, k, v):
      terms = (Term(mask, "multiply"), Term(bias, "add"))
      return attend(self, q, k, v, terms=terms, hook=hook)

  got = Layer().apply({}, q, k, v)
  logits = np.einsum("bnhd,bmhd->bhnm", q, k) / np.sqrt(5) * mask + bias
  logits = np.einsum("bhnm,hg->bgnm", logits, mix)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs = 2.0 * probs / probs.sum(-1, keepdims=True)
  np.testing.assert_allclose(got, np.einsum("bhnm,bmhd->bnhd", probs, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("implementation", ["cpu_kernels", "xla"])
def test_a_custom_scale_reaches_the_gated_kernel_on_every_path(implementation):
  """The gate rule with ``scale=0.3``: the fused CPU kernel, JAX's kernel and the explicit form
  against NumPy (ConViT Eq. 6). The CPU kernel once dropped the scale."""
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 4, 3, 5)), jnp.float32) for _ in range(3))
  pos = jax.nn.softmax(jnp.asarray(rng.normal(size=(3, 4, 4)), jnp.float32), -1)
  gate = jnp.asarray([0.2, 0.5, 0.9], jnp.float32)

  class Layer(flax.linen.Module):
    fused: bool

    @flax.linen.compact
    def __call__(self, q, k, v):
      terms = (Term(pos, "gate", gate),)
      return attend(
        self, q, k, v, terms=terms, scale=0.3, implementation=implementation, fused=self.fused
      )

  logits = np.einsum("bnhd,bmhd->bhnm", q, k) * 0.3
  content = np.exp(logits - logits.max(-1, keepdims=True))
  content /= content.sum(-1, keepdims=True)
  g = np.asarray(gate)[:, None, None]
  want = np.einsum("bhnm,bmhd->bnhd", (1 - g) * content + g * np.asarray(pos), v)
  for fused in (True, False):
    got = Layer(fused).apply({}, q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_quadratic_alpha_parameterization_is_spreads_sqrt_2_alpha():
  """Cordonnier et al. Eq. 9: ``-alpha ||delta - Delta||^2`` is spreads ``s = sqrt(2 alpha)``."""
  grid = TokenGrid(5, 5)
  centers = jnp.asarray([[0.0, 1.0], [-1.0, 0.5]])
  alpha = jnp.asarray([0.7, 3.0])
  by_alpha = QuadraticPositional(2, parameterization="alpha").apply(
    {"params": {"attention_centers": centers, "attention_alphas": alpha}}, grid
  )
  by_spread = QuadraticPositional(2).apply(
    {"params": {"attention_centers": centers, "attention_spreads": jnp.sqrt(2 * alpha)}}, grid
  )
  np.testing.assert_allclose(by_alpha, by_spread, rtol=1e-5, atol=1e-5)
  rows, cols = np.divmod(np.arange(25), 5)
  delta = np.stack([rows[None] - rows[:, None], cols[None] - cols[:, None]], -1)  # key - query
  dist = np.sum((delta[None] - np.asarray(centers)[:, None, None]) ** 2, -1)
  expected = -np.asarray(alpha)[:, None, None] * dist
  shift = (by_alpha - expected)[:, :, :1]  # a per-query constant drops out of the softmax
  np.testing.assert_allclose(by_alpha - shift, expected, rtol=1e-5, atol=1e-4)
  with pytest.raises(ValueError, match="parameterization='alpha' is isotropic"):
    QuadraticPositional(2, generalized=True, parameterization="alpha").init(jax.random.key(0), grid)


def test_attention_out_dim_changes_the_output_width():
  x = jnp.ones((2, 9, 6))
  layer = Attention(num_heads=2, out_dim=10)
  variables = layer.init(jax.random.key(0), x)
  assert layer.apply(variables, x).shape == (2, 9, 10)
  assert jnp.shape(flax.linen.meta.unbox(variables)["params"]["proj"]["kernel"]) == (2, 3, 10)


def test_call_time_terms_scale_and_value_skip_of_the_one_layer():
  """``Attention(x, terms=...)`` applies its own term, then the passed ones, in order, with the
  layer's ``scale``; ``value_skip`` adds the merged values (Swin's and T2T's use of the layer)."""
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(2, 4, 6)), jnp.float32)
  mask = jnp.asarray(rng.normal(size=(2, 4, 4)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(2, 1, 4, 4)), jnp.float32)  # per example, as Swin's shift
  layer = Attention(num_heads=2, scale=0.4, value_skip=True, out_dim=6)
  terms = (Term(mask, "multiply"), Term(bias, "add"))
  variables = layer.init(jax.random.key(0), x, terms=terms)
  got = layer.apply(variables, x, terms=terms)
  p = jax.tree.map(np.asarray, flax.linen.meta.unbox(variables)["params"])
  qkv = np.einsum("bnc,cthd->bnthd", np.asarray(x), p["qkv"]["kernel"]) + p["qkv"]["bias"]
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = np.einsum("bnhd,bmhd->bhnm", q, k) * 0.4 * np.asarray(mask) + np.asarray(bias)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  y = np.einsum("bhnm,bmhd->bnhd", probs / probs.sum(-1, keepdims=True), v)
  want = np.einsum("bnhd,hdc->bnc", y, p["proj"]["kernel"]) + p["proj"]["bias"] + v.reshape(2, 4, 6)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_one_layer_names_what_it_refuses():
  x = jnp.ones((1, 4, 4))
  with pytest.raises(ValueError, match="combine='gate' is GPSA's rule"):
    Attention(num_heads=2, combine="gate")
  with pytest.raises(ValueError, match="GPSA takes no context= or terms="):
    GPSA(num_heads=4).init(jax.random.key(0), x, x, grid=TokenGrid(2, 2))
  with pytest.raises(ValueError, match="fused qkv projection cannot read a context"):
    Attention(num_heads=2).init(jax.random.key(0), x, x)
  term = Term(jnp.ones((2, 4, 4)), "add")
  with pytest.raises(ValueError, match="no context="):
    TalkingHeadsAttention(2, 2).init(jax.random.key(0), x, x, terms=(term,))


def test_a_positional_term_that_does_not_fit_the_layer_is_named_in_one_line():
  """One's own model with a class token but no num_prefix_tokens, another grid, or a term of
  another head count: one line saying what to pass (was a broadcasting TypeError or a bare
  AssertionError from JAX's kernel)."""
  x, grid = jnp.ones((1, 17, 8)), TokenGrid(4, 4)
  layer = Attention(num_heads=2, positional=QuadraticPositional(2))
  with pytest.raises(ValueError, match=r"covers 16 patch tokens, but the layer got 17 tokens wi"):
    layer.init(jax.random.key(0), x, grid=grid)
  layer.init(jax.random.key(0), x, grid=grid, num_prefix_tokens=1)
  other_heads = Attention(num_heads=2, head_dim=4, positional=QuadraticPositional(4))
  with pytest.raises(ValueError, match="has 4 heads, the layer 2: build the term with num_heads"):
    other_heads.init(jax.random.key(0), x[:, 1:], grid=grid)


def test_a_layer_of_ones_own_model_names_a_bad_input_in_one_line():
  """Tokens not (B, N, C), a grid that is not a TokenGrid, a num_prefix_tokens out of range,
  num_heads 0: one line each before anything is traced (were a transpose TypeError, 'axis 4 is
  out of bounds', 'Grid 4x4 does not match 12 tokens', AttributeError, ZeroDivisionError)."""
  key, grid = jax.random.key(0), TokenGrid(4, 4)
  for layer in (GPSA(num_heads=2), Attention(num_heads=2, positional=QuadraticPositional(2))):
    name = type(layer).__name__
    with pytest.raises(ValueError, match=rf"^{name} takes tokens of shape \(batch, tokens, cha"):
      layer.init(key, jnp.ones((2, 4, 4, 8)), grid=grid)
    with pytest.raises(ValueError, match=r"got grid=\(4, 4\), not a TokenGrid: pass grid=Tok"):
      layer.init(key, jnp.ones((2, 16, 8)), grid=(4, 4))
    with pytest.raises(ValueError, match=r"num_prefix_tokens=-1 for 16 tokens: .* in \[0, 15\]"):
      layer.init(key, jnp.ones((2, 16, 8)), grid=grid, num_prefix_tokens=-1)
  with pytest.raises(ValueError, match=r"Grid 4x4 \(16 tokens\) does not match the 17 tokens g"):
    GPSA(num_heads=2).init(key, jnp.ones((2, 17, 8)), grid=grid)
  with pytest.raises(ValueError, match=r"^num_heads=0 must be a positive integer\.$"):
    Attention(num_heads=0)
  with pytest.raises(ValueError, match=r"TokenGrid needs integer sides .*, got 4.0x4.0\.$"):
    TokenGrid(4.0, 4.0)


def test_the_grid_passes_through_jax_and_flax_transforms():
  """TokenGrid is a static pytree: nn.remat of a layer, jax.jit and jax.vmap take it as a plain
  argument (was 'Cannot interpret value of type TokenGrid as an abstract array')."""
  x, grid = jax.random.normal(jax.random.key(1), (2, 6, 8)), TokenGrid(2, 3)
  variables = GPSA(num_heads=4).init(jax.random.key(0), x, grid=grid)
  expected = GPSA(num_heads=4).apply(variables, x, grid=grid)
  remat = nn.remat(GPSA)(num_heads=4)
  np.testing.assert_array_equal(remat.apply(variables, x, grid=grid), expected)
  apply = lambda x, grid: GPSA(num_heads=4).apply(variables, x[None], grid=grid)[0]
  np.testing.assert_allclose(jax.jit(jax.vmap(apply, (0, None)))(x, grid), expected, atol=1e-6)


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_a_train_step_lowers_for_accelerators(platform):
  """The 'xla' setting lowers for TPU and GPU from a CPU host (no compilation)."""
  model = create_model("gmm_swin_smalldata_patch2_32", num_classes=10, depths=(2, 2, 2))
  assert model.attention_implementation == "cpu_kernels"  # resolved for this CPU host
  model = model.clone(attention_implementation="xla")
  images = jnp.zeros((2, 32, 32, 3))
  variables = jax.eval_shape(model.init, jax.random.key(0), images)

  def loss(params, images):
    return jnp.mean(model.apply({"params": params}, images))

  traced = jax.jit(jax.grad(loss)).trace(variables["params"], images)
  text = traced.lower(lowering_platforms=(platform,)).as_text()
  assert "stablehlo.dot_general" in text
