"""The shared transformer layers: the exact GELU with a saved derivative."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locvit.models.layers import gelu

# Both tails (where erf and erfc differ most) and the region around 0.
X = jnp.linspace(-12.0, 12.0, 4801, dtype=jnp.float32)


def reference_gelu(x):
  return jax.nn.gelu(x, approximate=False)


def test_gelu_matches_jax_exact_gelu():
  np.testing.assert_allclose(gelu(X), reference_gelu(X), rtol=0, atol=2e-6)


def test_gelu_matches_torch_formula():
  torch = pytest.importorskip("torch")
  expected = torch.nn.functional.gelu(torch.from_numpy(np.asarray(X)), approximate="none").numpy()
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
