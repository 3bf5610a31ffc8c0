"""The shared transformer layers: the exact GELU with a saved derivative, the patch embedding,
the LayerNorm with a written-out backward pass."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locvit.attention.projections import DenseGeneral, partitioned, zeros
from locvit.models.layers import dense, gelu, layer_norm, normalize
from locvit.platform import ops

# Both tails (where erf and erfc differ most) and the region around 0.
X = jnp.linspace(-12.0, 12.0, 4801, dtype=jnp.float32)


def reference_gelu(x):
  return jax.nn.gelu(x, approximate=False)


def test_gelu_matches_jax_exact_gelu():
  np.testing.assert_allclose(gelu(X), reference_gelu(X), rtol=0, atol=2e-6)


def test_gelu_matches_torch_formula():
  torch = pytest.importorskip("torch")
  expected = torch.nn.functional.gelu(torch.from_numpy(np.array(X)), approximate="none").numpy()
  np.testing.assert_allclose(gelu(X), expected, rtol=0, atol=1e-6)


def test_gelu_gradient_matches_autodiff_of_exact_gelu():
  ours = jax.grad(lambda x: (gelu(x) * jnp.cos(x)).sum())(X)
  reference = jax.grad(lambda x: (reference_gelu(x) * jnp.cos(x)).sum())(X)
  np.testing.assert_allclose(ours, reference, rtol=0, atol=2e-6)


def test_gelu_second_derivative_and_forward_mode():
  # The custom JVP is itself differentiable: Hessian-vector products and jvp still work.
  second = jax.vmap(jax.grad(jax.grad(gelu)))(X)
  reference = jax.vmap(jax.grad(jax.grad(reference_gelu)))(X)
  np.testing.assert_allclose(second, reference, rtol=0, atol=1e-5)
  _, tangent = jax.jvp(gelu, (X,), (jnp.ones_like(X),))
  np.testing.assert_allclose(tangent, jax.vmap(jax.grad(reference_gelu))(X), rtol=0, atol=2e-6)


def test_gelu_keeps_dtype():
  x = X.astype(jnp.bfloat16)
  assert gelu(x).dtype == jnp.bfloat16
  assert jax.grad(lambda v: gelu(v).astype(jnp.float32).sum())(x).dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(gelu(x), np.float32), np.asarray(reference_gelu(x), np.float32), atol=0.07
  )


@pytest.mark.parametrize("implementation", ["cpu_kernels", "xla"])
def test_patch_embed_is_the_strided_convolution_with_its_parameters(implementation):
  """The patchify + matmul form (CPU) and the convolution give nn.Conv's init and numbers."""
  from locvit.models import layers

  images = jax.random.normal(jax.random.key(0), (2, 32, 48, 3))
  embed = layers.PatchEmbed(patch_size=8, embed_dim=16, implementation=implementation)
  variables = nn.meta.unbox(embed.init(jax.random.key(1), images))

  class Reference(nn.Module):  # the pre-change PatchEmbed: nn.Conv named 'proj'
    @nn.compact
    def __call__(self, x):
      y = nn.Conv(16, (8, 8), strides=8, padding="VALID", name="proj")(x)
      return y.reshape(y.shape[0], -1, 16)

  reference = Reference()
  reference_variables = reference.init(jax.random.key(1), images)
  for got, want in zip(
    jax.tree.leaves(variables), jax.tree.leaves(reference_variables), strict=True
  ):
    np.testing.assert_array_equal(got, want)  # same parameter paths, shapes and init values
  variables = jax.tree.map(lambda p: p + 0.1, variables)  # non-zero bias too

  def loss(fn):
    return jax.value_and_grad(lambda v, x: jnp.sum(jnp.sin(fn(v, x))), argnums=(0, 1))

  (value, grads), (want_value, want_grads) = (
    loss(lambda v, x: embed.apply(v, x)[0])(variables, images),
    loss(reference.apply)(variables, images),
  )
  assert embed.apply(variables, images)[1] == layers.TokenGrid(4, 6)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# Off-centre rows, as the residual stream's, where the variance's two passes matter.
LN_X = jax.random.normal(jax.random.key(0), (2, 5, 48)) * 3.0 + 1.5


def plain_layer_norm(x, scale, bias, eps, dtype):
  """The formula for autodiff to differentiate."""
  x = x.astype(jnp.float32)
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return ((x - mean) * jax.lax.rsqrt(var + eps) * scale + bias).astype(dtype)


def test_layer_norm_is_flax_layer_norm_with_its_parameters():
  flax_norm = nn.LayerNorm(
    epsilon=1e-6,
    use_fast_variance=False,
    scale_init=partitioned(nn.initializers.ones, ("embed",)),
    bias_init=partitioned(zeros, ("embed",)),
  )
  ours = layer_norm(1e-6, jnp.float32, "norm")
  describe = lambda tree: jax.tree.map(
    lambda p: (p.value.shape, p.value.dtype, p.names),
    tree,
    is_leaf=lambda p: isinstance(p, nn.LogicallyPartitioned),
  )
  boxed = flax_norm.init(jax.random.key(0), LN_X)
  assert describe(ours.init(jax.random.key(0), LN_X)) == describe(boxed)
  params = jax.tree.map(
    lambda p: p + jax.random.normal(jax.random.key(1), p.shape), nn.unbox(boxed)
  )
  np.testing.assert_allclose(ours.apply(params, LN_X), flax_norm.apply(params, LN_X), atol=2e-6)
  bf16 = layer_norm(1e-6, jnp.bfloat16, "norm").apply(params, LN_X.astype(jnp.bfloat16))
  assert bf16.dtype == jnp.bfloat16


@pytest.mark.parametrize(
  "build, shape",
  [
    (lambda impl: dense(20, ("embed", "mlp"), "fc", jnp.float32, jnp.float32, impl), (2, 5, 12)),
    (
      lambda impl: DenseGeneral((20,), ("heads", "kv", "embed"), 2, implementation=impl),
      (2, 3, 3, 4),
    ),
  ],
)
def test_bias_in_the_matmul_keeps_parameters_outputs_and_gradients(build, shape):
  """In a training step compiled for XLA:GPU (``ops.bias_in_matmul``) a dense layer adds its
  bias inside the matmul (``ops.affine``): the CPU paths' parameters (names, shapes, logical
  axes, initial values: ``nn.Dense``'s for ``dense``), and outputs and gradients equal to theirs
  (``x @ kernel + bias``) to float32 rounding; fan-in 12 takes three zero columns."""
  x = jax.random.normal(jax.random.key(0), shape)
  cpu, xla = build("cpu_kernels"), build("xla")
  boxed = cpu.init(jax.random.key(1), x)
  ours = xla.init(jax.random.key(1), x)
  assert jax.tree.structure(ours) == jax.tree.structure(boxed)  # names, logical axes
  jax.tree.map(np.testing.assert_array_equal, nn.unbox(ours), nn.unbox(boxed))
  params = jax.tree.map(lambda p: p + 0.5, nn.unbox(boxed))
  loss = lambda module: jax.value_and_grad(
    lambda p, x: jnp.sum(jnp.sin(module.apply(p, x))), argnums=(0, 1)
  )
  with ops.training_step_fusions(bias_in_matmul=True):
    got = loss(xla)(params, x)
    assert "concatenate" in str(jax.make_jaxpr(loss(xla))(params, x))  # the ones column
  want = loss(cpu)(params, x)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6), got, want)


def test_bias_stays_out_of_the_matmul_on_partitioned_inputs_and_off_xla_gpu_steps():
  """Under logical-axis rules that partition a layer's contracted axis (tensor parallel's 'mlp')
  its bias is added after the matmul: a ones column would reshard the inputs. So it is outside
  a training step compiled for XLA:GPU (evaluation; TPU, whose 128-wide matrix unit would take a
  whole tile more for 384 + 8)."""
  x = jnp.ones((2, 3, 8))
  fc2 = dense(4, ("mlp", "embed"), "fc2", jnp.float32, jnp.float32, "xla")
  params = fc2.init(jax.random.key(0), x)
  concatenates = lambda: str(jax.make_jaxpr(fc2.apply)(params, x)).count("concatenate")
  assert concatenates() == 0
  with ops.training_step_fusions(per_example_sums=True):  # the step compiled for XLA:TPU
    assert concatenates() == 0
  with ops.training_step_fusions(per_example_sums=True, bias_in_matmul=True):
    assert concatenates() == 1
    with nn.logical_axis_rules((("batch", "data"), ("mlp", "model"))):
      assert concatenates() == 0


@pytest.mark.parametrize("attention", ["mhsa", "gpsa", "quadratic"])
def test_stochastic_depth_inside_the_last_projections_keeps_the_block(attention):
  """In a training step compiled for XLA:GPU each branch's stochastic depth scales the operands
  of its last matmul (``row_scale``: the attention's output projection, fc2): the block's output
  and gradients equal the CPU paths' (the branch times ``drop_examples``' mask) to float32
  rounding, the dropped examples' included."""
  from locvit.attention import TokenGrid
  from locvit.models.layers import Block

  x, grid = jax.random.normal(jax.random.key(0), (4, 4, 16)), TokenGrid(2, 2)
  keep = jnp.array([[True, False, True, True], [False, True, True, False]])
  block = lambda impl: Block(num_heads=4, drop_path=0.25, attention=attention, implementation=impl)
  params = block("cpu_kernels").init(jax.random.key(1), x, grid)

  def loss_and_grads(impl):
    loss = lambda p, x: jnp.sum(jnp.sin(block(impl).apply(p, x, grid, train=True, keep=keep)))
    return jax.value_and_grad(loss, argnums=(0, 1))(params, x)

  with ops.training_step_fusions(bias_in_matmul=True):
    got = loss_and_grads("xla")
  want = loss_and_grads("cpu_kernels")
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), got, want)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_gradients_equal_autodiff_of_the_formula(dtype):
  scale, bias, cotangent = (
    jax.random.normal(jax.random.key(k), s) for k, s in ((1, (48,)), (2, (48,)), (3, LN_X.shape))
  )
  x, cotangent = LN_X.astype(dtype), cotangent.astype(dtype)

  def grads(fn):
    loss = lambda *args: (fn(*args, 1e-6, dtype).astype(jnp.float32) * cotangent).sum()
    return jax.grad(loss, argnums=(0, 1, 2))(x, scale, bias)

  (dx, dscale, dbias), (want_dx, want_dscale, want_dbias) = (
    grads(normalize),
    grads(plain_layer_norm),
  )
  assert dx.dtype == dtype and dscale.dtype == dbias.dtype == jnp.float32
  # float32 rounding in the sums' order; bf16's dx is rounded to bf16 after the same float32 math.
  dx_tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=8e-3, atol=1e-3)
  np.testing.assert_allclose(np.float32(dx), np.float32(want_dx), **dx_tolerance)
  np.testing.assert_allclose(dscale, want_dscale, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dbias, want_dbias, rtol=1e-5, atol=1e-5)


def test_layer_norm_parameter_sums_per_example_equal_the_plain_sums():
  """In the training step off the CPU code paths (``training_step_fusions(per_example_sums=
  True)``) LayerNorm's scale and bias gradients are summed over each example's tokens, then over
  the examples (``ops.broadcast_per_example``): the plain sums to float rounding; the loss and the
  input's gradient bit for bit."""
  from locvit.platform.ops import training_step_fusions

  x, cotangent = (jax.random.normal(jax.random.key(k), (4, 9, 48)) for k in (0, 2))
  norm = layer_norm(1e-6, jnp.float32, "norm")
  params = nn.unbox(norm.init(jax.random.key(1), x))
  params = jax.tree.map(lambda p: p + jax.random.normal(jax.random.key(3), p.shape), params)
  loss = lambda p, x: jnp.sum(norm.apply(p, x) * cotangent)

  @functools.partial(jax.jit, static_argnums=0)
  def loss_and_grads(split, params, x):
    with training_step_fusions(per_example_sums=split):
      return jax.value_and_grad(loss, argnums=(0, 1))(params, x)

  (plain, (plain_params, plain_x)), (split, (split_params, split_x)) = (
    loss_and_grads(s, params, x) for s in (False, True)
  )
  assert split == plain
  np.testing.assert_array_equal(split_x, plain_x)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  jax.tree.map(close, split_params, plain_params)
  sums = lambda split: str(jax.make_jaxpr(loss_and_grads, static_argnums=0)(split, params, x))
  assert sums(True).count("reduce_sum") == sums(False).count("reduce_sum") + 1  # two stages


def test_layer_norm_keeps_forward_mode():
  """``jax.jvp`` (and so ``jax.hessian``, forward-over-reverse Hessian-vector products) through
  the backbones' LayerNorm: its derivative is a ``custom_jvp``, equal to the formula's."""
  scale, bias, tangent = (
    jax.random.normal(jax.random.key(k), s) for k, s in ((1, (48,)), (2, (48,)), (3, LN_X.shape))
  )
  primals, tangents = (LN_X, scale, bias), (tangent, 0.5 * scale, -bias)
  jvp = lambda fn: jax.jvp(lambda *a: fn(*a, 1e-6, jnp.float32), primals, tangents)
  for got, want in zip(jvp(normalize), jvp(plain_layer_norm)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_remat_blocks_keep_parameters_and_gradients():
  from locvit.models import create_model

  images = jnp.ones((2, 32, 32, 3))
  plain = create_model("deit_tiny_patch4_32", num_classes=10, drop_path_rate=0.1)
  remat = create_model("deit_tiny_patch4_32", num_classes=10, drop_path_rate=0.1, remat=True)
  params = plain.init(jax.random.key(0), images)["params"]
  assert jax.tree.structure(remat.init(jax.random.key(0), images)["params"]) == jax.tree.structure(
    params
  )

  def grads(model):
    loss = lambda p: model.apply(
      {"params": p}, images, train=True, rngs={"dropout": jax.random.key(1)}
    ).sum()
    return jax.grad(loss)(params)

  for a, b in zip(jax.tree.leaves(grads(remat)), jax.tree.leaves(grads(plain))):
    # Recomputation may fuse differently: the drop-path scaling rounds apart by up to ~4e-5
    # relative in a few head gradients, depending on which examples the masks drop.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_drop_path_masks_drop_examples_as_drop_path_does():
  from locvit.models import layers

  class Drawer(nn.Module):
    @nn.compact
    def __call__(self, train):
      return layers.drop_path_masks(self, (0.0, 0.25, 1.0), 4000, train)

  rngs = {"dropout": jax.random.key(3)}
  keep = Drawer().apply({}, True, rngs=rngs)
  assert keep.shape == (3, 2, 4000) and keep.dtype == jnp.bool_
  assert keep[0].all() and not keep[2].any() and abs(keep[1].mean() - 0.75) < 0.02
  assert Drawer().apply({}, False, rngs=rngs) is None
  # With the mask nn.Dropout draws from a key, the same numbers as drop_path(rate).
  y, key = jax.random.normal(jax.random.key(0), (8, 5, 3)), jax.random.key(1)
  want = layers.drop_path(0.25).apply({}, y, deterministic=False, rng=key)
  mask = jax.random.bernoulli(key, 0.75, (8, 1, 1)).reshape(8)
  np.testing.assert_array_equal(layers.drop_examples(y, mask, 0.25), want)


def test_training_step_fusions_keep_outputs_and_gradients_exactly():
  """Inside ``training_step_fusions`` every layer casts its parameters through the one shared
  ``one``, also inside ``nn.remat`` blocks: bf16 outputs and float32 gradients equal bit for bit;
  no tracer leaks (checked without remat, whose own cache trips ``checking_leaks``)."""
  import contextlib

  from locvit.models import create_model
  from locvit.platform.ops import training_step_fusions

  images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))

  def build(remat):
    model = create_model(
      "deit_tiny_patch4_32", num_classes=10, depth=2, dtype=jnp.bfloat16, remat=remat
    )
    params = model.init(jax.random.key(1), images)["params"]

    def forward(p, shared):
      with training_step_fusions() if shared else contextlib.nullcontext():
        return model.apply({"params": p}, images)

    loss = lambda p, shared: jnp.square(forward(p, shared).astype(jnp.float32)).sum()
    return params, forward, jax.value_and_grad(loss)

  params, forward, loss_grad = build(remat=True)
  step = jax.jit(loss_grad, static_argnums=1)
  (plain_loss, plain_grads), (shared_loss, shared_grads) = step(params, False), step(params, True)
  assert shared_loss == plain_loss
  jax.tree.map(np.testing.assert_array_equal, shared_grads, plain_grads)
  # One multiply per float32 parameter cast to bf16: each block's qkv, proj, fc1 and fc2 kernel
  # and bias, the patch embedding's and the head's.
  jaxpr = lambda shared: str(jax.make_jaxpr(forward, static_argnums=1)(params, shared))
  assert jaxpr(True).count(" mul ") - jaxpr(False).count(" mul ") == 2 * 8 + 2 + 2
  params, _, loss_grad = build(remat=False)
  with jax.checking_leaks():
    jax.make_jaxpr(loss_grad, static_argnums=1)(params, True)


def test_the_training_step_adds_biases_inside_the_matmuls_only_when_compiled_for_xla_gpu():
  """``train_step``'s ``platform`` (the backend it is compiled for) decides: 'gpu' puts the
  ones columns in (a concatenation per dense layer), 'tpu' keeps the plain bias add."""
  from locvit import optim
  from locvit.models.factory import build_model
  from locvit.run.state import TrainState
  from locvit.run.step import train_step
  from tests.train_utils import tiny_config

  config = tiny_config(attention_implementation="xla")
  model = build_model(config, 10)
  images = jnp.zeros((4, 8, 8, 1))
  params = nn.meta.unbox(model.init(jax.random.key(0), images)["params"])
  schedule = optim.make_schedule(config, 10, 1)
  tx = optim.make_optimizer(config, params, schedule)
  state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), {})
  batch = {"image": images, "label": jnp.zeros((4,), jnp.int32)}

  def concatenations(platform):
    step = functools.partial(
      train_step, model=model, tx=tx, schedule=schedule, config=config, num_classes=10
    )
    return str(jax.make_jaxpr(functools.partial(step, platform=platform))(state, batch)).count(
      "concatenate"
    )

  # Two blocks of qkv, proj, fc1 and fc2, forward; their transposes slice, not concatenate.
  assert concatenations("gpu") - concatenations("tpu") == 2 * 4
  assert concatenations(None) == concatenations("tpu")  # this host's backend: XLA:CPU
