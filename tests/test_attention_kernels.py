"""The attention kernel with a hand-written backward pass, and the CPU-friendly projections."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locvit.attention import softmax_attention
from locvit.attention.softmax_attention import dot_product_attention
from locvit.platform import ops


def _qkv(batch=2, tokens=7, heads=3, head_dim=4, value_dim=None, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 3)
  shapes = [(batch, tokens, heads, head_dim)] * 2 + [(batch, tokens, heads, value_dim or head_dim)]
  return [jax.random.normal(key, shape, dtype) for key, shape in zip(keys, shapes)]


@pytest.mark.parametrize("bias_batch", [None, 1, 2])
def test_einsum_kernel_matches_jax_in_values_and_all_gradients(bias_batch):
  q, k, v = _qkv()
  args = [q, k, v]
  if bias_batch is not None:
    args.append(2.0 * jax.random.normal(jax.random.key(1), (bias_batch, 3, 7, 7)))

  def loss(implementation):
    def fn(*a):
      bias = a[3] if len(a) == 4 else None
      return jnp.sum(jnp.sin(dot_product_attention(*a[:3], bias, implementation)))

    return jax.value_and_grad(fn, argnums=tuple(range(len(args))))

  value, grads = jax.jit(loss("cpu_kernels"))(*args)
  want_value, want_grads = loss("xla")(*args)
  np.testing.assert_allclose(value, want_value, rtol=1e-6)
  for got, want in zip(grads, want_grads, strict=True):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_einsum_kernel_keeps_low_precision_dtypes():
  q, k, v = _qkv(dtype=jnp.bfloat16)
  out = dot_product_attention(q, k, v, implementation="cpu_kernels")
  assert out.dtype == jnp.bfloat16
  grads = jax.grad(
    lambda *a: jnp.sum(dot_product_attention(*a, implementation="cpu_kernels").astype(jnp.float32)),
    argnums=(0, 1, 2),
  )(q, k, v)
  assert all(g.dtype == jnp.bfloat16 for g in grads)
  reference = dot_product_attention(
    *(t.astype(jnp.float32) for t in (q, k, v)), implementation="xla"
  )
  np.testing.assert_allclose(out.astype(jnp.float32), reference, atol=3e-2)


def test_default_implementation_is_the_cpu_kernels_on_cpu_and_bad_input_is_named():
  assert jax.default_backend() == "cpu"
  assert softmax_attention.resolve_implementation(None, jax.default_backend()) == "cpu_kernels"
  # 'einsum': the earlier name
  assert softmax_attention.resolve_implementation("einsum", "cpu") == "cpu_kernels"
  assert softmax_attention.resolve_implementation("xla", "cpu") == "xla"
  with pytest.raises(ValueError, match=r"implementation='flash' is not one of"):
    softmax_attention.resolve_implementation("flash", "cpu")
  q, k, v = _qkv()
  with pytest.raises(ValueError, match=r"bias must be \(B, H, N, N\) or \(1, H, N, N\)"):
    dot_product_attention(q, k, v, bias=jnp.zeros((3, 7, 7)), implementation="cpu_kernels")


@pytest.mark.parametrize("scale", [None, 0.3])
def test_gated_kernel_matches_renormalised_gpsa_mix_in_values_and_gradients(scale):
  """ConViT Eq. 6 (with the renormalisation) against the fused kernel, gradients to the logits;
  a custom logit scale is used by both passes."""
  q, k, v = _qkv(heads=4, tokens=9)
  pos_logits = 2.0 * jax.random.normal(jax.random.key(5), (4, 9, 9))
  gating = jax.random.normal(jax.random.key(6), (4,))

  def reference(q, k, v, pos_logits, gating):
    factor = q.shape[-1] ** -0.5 if scale is None else scale
    content = jax.nn.softmax(jnp.einsum("bnhd,bmhd->bhnm", q, k) * factor, -1)
    g = jax.nn.sigmoid(gating)[:, None, None]
    mixed = (1 - g) * content + g * jax.nn.softmax(pos_logits, -1)
    mixed = mixed / jnp.sum(mixed, -1, keepdims=True)
    return jnp.einsum("bhnm,bmhd->bnhd", mixed, v)

  def fused(q, k, v, pos_logits, gating):
    pos, gate = jax.nn.softmax(pos_logits, -1), jax.nn.sigmoid(gating)
    return softmax_attention.gated_positional_attention(q, k, v, pos, gate, scale)

  def loss(fn):
    return jax.value_and_grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), argnums=tuple(range(5)))

  args = (q, k, v, pos_logits, gating)
  (value, grads), (want_value, want_grads) = jax.jit(loss(fused))(*args), loss(reference)(*args)
  np.testing.assert_allclose(value, want_value, rtol=2e-5)
  for got, want in zip(grads, want_grads, strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.abs(grads[4]).min() > 0  # every gate gets a gradient


@pytest.mark.parametrize("flatten", [True, False])
@pytest.mark.parametrize("num_contracting", [1, 2])
def test_contract_equals_tensordot_with_and_without_flattening(flatten, num_contracting):
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 4))
  kernel_shape = {1: (4, 2, 6), 2: (3, 4, 2, 6)}[num_contracting]
  kernel = jax.random.normal(jax.random.key(1), kernel_shape)

  def loss(fn):
    return jax.value_and_grad(lambda a, b: jnp.sum(jnp.cos(fn(a, b))), argnums=(0, 1))

  got = loss(lambda a, b: ops.contract(a, b, num_contracting, flatten=flatten))(x, kernel)
  want = loss(lambda a, b: jnp.tensordot(a, b, axes=num_contracting))(x, kernel)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for g, w in zip(got[1], want[1], strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_dense_dot_general_is_a_drop_in_for_flax_dense():
  x = jax.random.normal(jax.random.key(0), (2, 9, 8))
  plain, flat = nn.Dense(5), nn.Dense(5, dot_general=ops.dense_dot_general("cpu_kernels"))
  assert ops.dense_dot_general("xla") is jax.lax.dot_general
  params = plain.init(jax.random.key(1), x)
  assert jax.tree.map(jnp.shape, flat.init(jax.random.key(1), x)) == jax.tree.map(jnp.shape, params)

  def loss(module):
    return jax.grad(lambda p: jnp.sum(module.apply(p, x) ** 2))

  np.testing.assert_allclose(flat.apply(params, x), plain.apply(params, x), rtol=1e-6)
  for g, w in zip(
    jax.tree.leaves(loss(flat)(params)), jax.tree.leaves(loss(plain)(params)), strict=True
  ):
    np.testing.assert_allclose(g, w, rtol=1e-5)
  # Other contraction patterns are passed through to lax.dot_general untouched.
  a, b = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
  batched = ops.dense_dot_general("cpu_kernels")(a, b, (((2,), (1,)), ((0,), (0,))))
  np.testing.assert_array_equal(batched, jnp.full((2, 3, 5), 4.0))
