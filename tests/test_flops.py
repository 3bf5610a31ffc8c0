"""``locvit.platform.flops.xla_flops``: XLA's count from a lowering, from the compiled executable
where the lowering counts nothing (XLA:GPU), through each form of JAX's cost analysis."""

import math

import jax
import jax.numpy as jnp
import pytest

from locvit.platform.flops import xla_flops

MATMUL_FLOPS = 2 * 8**3  # x @ x, x 8x8


@pytest.fixture
def lowered():
  return jax.jit(lambda x: x @ x).lower(jnp.ones((8, 8)))


def test_a_lowering_and_its_executable_count_a_matmul(lowered):
  assert xla_flops(lowered) == xla_flops(lowered.compile()) == MATMUL_FLOPS


def test_a_list_of_counts_is_read_from_its_first(lowered, monkeypatch):
  monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", lambda self: [{"flops": 3.0}])
  assert xla_flops(lowered) == 3.0


@pytest.mark.parametrize("nothing", [None, {}, [], [{"bytes accessed": 1.0}]])
def test_a_lowering_that_counts_nothing_is_counted_compiled(lowered, monkeypatch, nothing):
  monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", lambda self: nothing)
  assert xla_flops(lowered) == MATMUL_FLOPS
  monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: [{"flops": 5.0}])
  assert xla_flops(lowered) == 5.0
  monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: nothing)
  assert math.isnan(xla_flops(lowered))
