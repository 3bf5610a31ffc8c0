"""Device mesh, logical-axis rules and global arrays.

Parameters carry logical axis names (``nn.with_logical_partitioning``); a *layout* maps those names
onto the mesh axes ``('data', 'model')``:

- ``dp``: parameters replicated, batch split over every device (the default).
- ``fsdp``: parameters (and optimizer state) additionally split over ``data`` on their ``embed``
  axis (ZeRO-3 style); XLA inserts the all-gathers.
- ``tp``: Megatron-style tensor parallelism: MLP hidden units and attention heads split over
  ``model``; batch split over ``data``.

A parameter dimension that a mesh axis does not divide is left unsharded rather than failing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from locvit.choices import check_choice

MESH_AXES = ("data", "model")
Rules = tuple[tuple[str, Any], ...]

LAYOUTS: dict[str, Rules] = {
  "dp": (("batch", "data"),),
  "fsdp": (("batch", "data"), ("embed", "data")),
  "tp": (("batch", "data"), ("mlp", "model"), ("heads", "model"), ("classes", None)),
}


def logical_rules(mesh_config: ml_collections.ConfigDict) -> Rules:
  """The logical-axis rules for a mesh config: an explicit ``rules`` tuple wins over ``layout``."""
  if mesh_config.rules:
    return tuple(tuple(r) for r in mesh_config.rules)
  check_choice("mesh.layout", mesh_config.layout, sorted(LAYOUTS))
  return LAYOUTS[mesh_config.layout]


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Fills one ``-1`` entry and checks that the mesh uses exactly ``num_devices`` devices."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != len(MESH_AXES):
    raise ValueError(f"mesh.shape={shape} must have {len(MESH_AXES)} entries for axes {MESH_AXES}.")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh.shape={shape}: use positive sizes and at most one -1.")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ValueError(f"mesh.shape={shape} cannot be completed for {num_devices} devices.")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != num_devices:
    valid = [(d, num_devices // d) for d in range(1, num_devices + 1) if num_devices % d == 0]
    raise ValueError(
      f"mesh.shape={shape} needs {math.prod(shape)} devices but {num_devices} are available. "
      f"Valid (data, model) shapes: {valid} (or use -1 for one axis)."
    )
  return shape


def make_mesh(mesh_config: ml_collections.ConfigDict, devices=None) -> Mesh:
  """Builds the ('data', 'model') mesh; ``mesh.num_devices > 0`` uses only the first N devices."""
  devices = jax.devices() if devices is None else devices
  if mesh_config.num_devices:
    if mesh_config.num_devices > len(devices):
      raise ValueError(
        f"mesh.num_devices={mesh_config.num_devices} but only {len(devices)} devices exist."
      )
    devices = devices[: mesh_config.num_devices]
  shape = resolve_mesh_shape(mesh_config.shape, len(devices))
  # Linen's logical constraints need Auto axes; make_mesh defaults to Explicit.
  return jax.make_mesh(
    shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(shape), devices=devices
  )


def data_parallel_size(mesh: Mesh, rules: Rules) -> int:
  """Number of ways the batch axis is split."""
  axes = dict(rules).get("batch")
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  return math.prod(mesh.shape[a] for a in axes)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """Leading (batch) axis split as the logical axis 'batch' maps under ``rules``."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), rules))


def replicated(mesh: Mesh) -> NamedSharding:
  """A full copy on every device of ``mesh``."""
  return NamedSharding(mesh, P())


def _fit_spec(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
  """Drops mesh axes from dimensions they do not divide evenly."""
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[a] for a in names)
    fitted.append(axes if names and dim % size == 0 else None)
  return P(*fitted)


def tree_shardings(boxed_abstract: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings for a tree of (possibly logically boxed) abstract arrays."""
  specs = nn.logical_to_mesh(nn.get_partition_spec(boxed_abstract), rules)
  shapes = jax.tree.map(lambda x: x.shape, nn.meta.unbox(boxed_abstract))
  return jax.tree.map(
    lambda spec, shape: NamedSharding(mesh, _fit_spec(spec, shape, mesh)),
    specs,
    shapes,
    is_leaf=lambda x: isinstance(x, P),
  )


def opt_state_shardings(abstract_opt_state, abstract_params, param_shardings, mesh):
  """Shards each optimizer-state leaf like the parameter it mirrors (Adam's mu and nu, momentum):
  the parameter whose dict-key path is the longest suffix of the leaf's path and whose shape is
  equal. Everything else (counts, scalars) is replicated. Works for any optax chain, including
  ``multi_transform`` / ``masked`` states.
  """
  flat = lambda tree: {
    tuple(k.key for k in path): v for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  }
  shapes, shardings = flat(abstract_params), flat(param_shardings)

  def pick(path, leaf):
    keys = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
    for start in range(len(keys)):
      shape = shapes.get(keys[start:])
      if shape is not None and shape.shape == leaf.shape:
        return shardings[keys[start:]]
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(pick, abstract_opt_state)


def init_model_variables(model: nn.Module, image_shape: tuple[int, ...], rng: jax.Array):
  """Boxed ``(params, other collections)`` from ``model.init`` on one zero image."""
  variables = model.init({"params": rng}, jnp.zeros((1, *image_shape), jnp.float32))
  return variables["params"], {k: v for k, v in variables.items() if k != "params"}


def model_variable_shapes(model: nn.Module, image_shape: tuple[int, ...]) -> tuple[Any, Any]:
  """Boxed abstract ``(params, other collections)`` of ``model`` (shapes and logical axes)."""
  return jax.eval_shape(
    lambda rng: init_model_variables(model, image_shape, rng), jax.random.key(0)
  )


def with_shardings(abstract: Any, shardings: Any) -> Any:
  """``ShapeDtypeStruct``s of ``abstract`` carrying ``shardings`` (a restore or jit target)."""
  return jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )


def global_batch(
  local_batch: dict[str, np.ndarray], sharding: NamedSharding
) -> dict[str, jax.Array]:
  """Builds global arrays from this process's slice of the batch (multi-host safe)."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local_batch)
