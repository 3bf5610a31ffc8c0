"""The training state: its fields, its shardings, its abstract shape and its initialisation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from locvit import init as init_lib
from locvit.init import from_checkpoint
from locvit.platform import sharding


@flax.struct.dataclass
class TrainState:
  """``model_state`` holds the non-parameter collections (BatchNorm's ``batch_stats``), or {};
  ``ema_params`` the exponential moving average of ``params`` when ``config.ema.decay > 0``, or {}.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any = flax.struct.field(default_factory=dict)
  ema_params: Any = flax.struct.field(default_factory=dict)


def ema_enabled(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config.ema`` is present with ``decay > 0`` (the state then carries EMA weights)."""
  return config.ema is not None and config.ema.decay > 0


def state_shardings(
  boxed_params, tx, mesh, rules, boxed_model_state=None, ema: bool = False
) -> TrainState:
  """Shardings of the whole TrainState; the EMA weights are sharded like the parameters."""
  params = sharding.tree_shardings(boxed_params, mesh, rules)
  model_state = sharding.tree_shardings(boxed_model_state or {}, mesh, rules)
  abstract_params = nn.meta.unbox(boxed_params)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  return TrainState(
    step=sharding.replicated(mesh),
    params=params,
    opt_state=sharding.opt_state_shardings(abstract_opt, abstract_params, params, mesh),
    model_state=model_state,
    ema_params=params if ema else {},
  )


@dataclasses.dataclass(frozen=True)
class StateLayout:
  """A TrainState before it exists: ``shardings``, ``abstract`` (shapes carrying the shardings,
  the target of a restore) and ``init(rng)``, the fresh state (jit it with ``out_shardings``)."""

  shardings: TrainState
  abstract: TrainState
  init: Callable[[jax.Array], TrainState]


def state_layout(model, image_shape, tx, mesh, rules, ema: bool = False) -> StateLayout:
  """The layout of the TrainState of ``model`` on ``image_shape`` inputs, optimized by ``tx``."""
  boxed_params, boxed_model_state = sharding.model_variable_shapes(model, image_shape)
  shardings = state_shardings(boxed_params, tx, mesh, rules, boxed_model_state, ema=ema)

  def init(rng):
    params, model_state = nn.meta.unbox(sharding.init_model_variables(model, image_shape, rng))
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      model_state=model_state,
      ema_params=jax.tree.map(jnp.copy, params) if ema else {},
    )

  abstract = sharding.with_shardings(jax.eval_shape(init, jax.random.key(0)), shardings)
  return StateLayout(shardings, abstract, init)


def apply_initializer(
  config, state: TrainState, model, tx, shardings: TrainState, warmstart=None
) -> TrainState:
  """Applies ``config.init`` (impulse, mimetic, ... see ``locvit.init``) or the ``init_from``
  parameters (``warmstart``) to a fresh state; optimizer state and EMA restart from them.

  Runs only when a run starts from scratch; a resumed run restores the initialised parameters.
  """
  init_cfg = config.init
  if warmstart is not None:
    from_checkpoint.check_matches(warmstart.params, state.params, "parameters")
    from_checkpoint.check_matches(warmstart.model_state, state.model_state, "model state")
    params, model_state = warmstart.params, warmstart.model_state
  elif init_cfg is not None and init_cfg.name != "none":
    seed = config.seed if init_cfg.seed is None else init_cfg.seed  # follows the run's seed
    params = init_lib.apply_init(
      init_cfg, jax.device_get(state.params), model, config.data.image_size, seed=seed
    )
    model_state = state.model_state
  else:
    return state
  params = jax.device_put(params, shardings.params)
  model_state = jax.device_put(model_state, shardings.model_state)
  opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
  ema_params = jax.tree.map(jnp.copy, params) if ema_enabled(config) else {}
  return state.replace(
    params=params, opt_state=opt_state, model_state=model_state, ema_params=ema_params
  )
