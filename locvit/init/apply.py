"""Applying an initialization named in a config to a freshly initialised params tree.

    config.init = init_config('impulse', filter_size=3, mode='different')
    params = apply_init(config.init, params, model, config.data.image_size)

Names (paper Sec. 5.1 "Initialization", Tables 2, 3, 6, 8):

- 'none': the model's own init, unchanged.
- 'trunc_normal': timm's default ViT init ("Trunc Normal").
- 'kaiming_uniform': PyTorch's default init ("Kaiming Uniform").
- 'xavier_normal': the GMM paper's official ViT init (xavier-normal Linear kernels, N(0, 1)
  position embedding and class token; ``baselines.xavier_normal``).
- 'mimetic': Trockman & Kolter's mimetic q/k (and value/output) init.
- 'impulse': the structured impulse init (Algorithm 1) solved by ``impulse.solve_impulse``.

For 'mimetic' and 'impulse', ``base`` first re-initialises every Linear/Conv: the reference
(``weight_init='impulse3'`` / ``'mimetic0.7_0.7'``) bypasses timm's ``init_weights``, so its other
weights (V, proj, MLP, head, q/k biases) are PyTorch defaults; ``base='kaiming_uniform'``
reproduces that, ``'trunc_normal'`` gives timm's init and ``'keep'`` keeps the model's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging

from locvit.attention import TokenGrid
from locvit.choices import Errors, check_choice
from locvit.configs import defaults
from locvit.configs.defaults import INIT_NAMES
from locvit.init.baselines import BASELINES, BASES, apply_baseline
from locvit.init.impulse import MODES, solve_impulse, solver_config
from locvit.init.layout import (
  LAYOUTS,
  AttentionLayout,
  attention_dims,
  find_qk_kernels,
  flatten,
  get_layout,
  set_qk,
  unflatten,
)
from locvit.init.mimetic import VPROJ_MODES, apply_mimetic
from locvit.platform.ops import cpu_kernels


def init_config(name: str = "impulse", **overrides: Any) -> ml_collections.ConfigDict:
  """``locvit.configs.defaults.init_config`` (the block's fields and defaults), with the
  ``solver`` preset of an 'impulse' block checked here: a bad one fails naming the valid ones."""
  cfg = defaults.init_config(name, **overrides)
  if name == "impulse":
    solver_config(cfg)
  return cfg


def check_init_config(init_cfg: Mapping[str, Any]) -> None:
  """The choices of an init block (``name``; for mimetic and impulse ``base``, ``qk_layout``,
  ``vproj``, ``mode``, the ``solver`` preset), every wrong one a line, before a run builds
  anything. What needs the model (its kernels, its token grid) is checked by ``apply_init``."""
  errors = Errors()
  name = init_cfg.get("name", "none")
  errors.check(check_choice, "init.name", name, INIT_NAMES)
  if name in ("mimetic", "impulse"):
    cfg = _with_defaults(init_cfg)
    errors.check(check_choice, "init.base", cfg["base"], BASES)
    if not isinstance(cfg["qk_layout"], AttentionLayout):
      errors.check(check_choice, "init.qk_layout", cfg["qk_layout"], sorted(LAYOUTS))
    if name == "mimetic":
      errors.check(check_choice, "init.vproj", cfg["vproj"], VPROJ_MODES)
    else:
      errors.check(check_choice, "init.mode", cfg["mode"], MODES)
      errors.check(solver_config, cfg)
  errors.raise_all()


def token_grid(model: nn.Module, image_size: int | tuple[int, int]) -> TokenGrid:
  """The model's patch grid for ``image_size`` (needs a ``patch_size`` field)."""
  patch = getattr(model, "patch_size", None)
  if patch is None:
    raise ValueError(
      f"{type(model).__name__} has no patch_size: impulse init needs the token grid; pass "
      "grid=TokenGrid(H, W) of the attention layers' patch tokens."
    )
  height, width = (image_size, image_size) if np.isscalar(image_size) else image_size
  if height % patch or width % patch:
    raise ValueError(f"Image size {height}x{width} is not divisible by patch_size={patch}.")
  return TokenGrid(height // patch, width // patch)


def write_impulse(params: Any, solution, layout: AttentionLayout) -> Any:
  """Query kernel of head h = ``Q[h]``, key kernel = ``K[h]^T`` in every layer (no scale).

  ``params`` plain or boxed with logical axes (what ``layer.init`` returns); the structure is
  kept."""
  values, boxes = _unbox(params)
  flat = {k: np.asarray(v) for k, v in flatten(values).items()}
  paths = find_qk_kernels(flat, layout)
  if len(paths) != len(solution.layer_solve):
    raise ValueError(
      f"{len(paths)} attention layers but a solution for {len(solution.layer_solve)}."
    )
  for index, path in enumerate(paths):
    q, k = solution.layer(index)  # (H, D, hd), (H, hd, D)
    flat[path] = set_qk(flat[path], layout, np.transpose(q, (1, 0, 2)), np.transpose(k, (2, 0, 1)))
  return _rebox(unflatten(flat, values), boxes)


def _solver_batching(model) -> str:
  """'map' (one solve after another) with the CPU code paths, else 'vmap': the model's resolved
  kernel setting decides, not a backend check here (without a model, the solver's 'vmap')."""
  return "map" if cpu_kernels(getattr(model, "attention_implementation", None)) else "vmap"


def _impulse(cfg: Mapping, params: Any, model, grid: TokenGrid, layout, seed: int):
  flat = flatten(params)
  paths = find_qk_kernels(flat, layout)
  dim, heads, head_dim = attention_dims(flat, paths)
  if getattr(model, "pool", "gap") == "token":
    logging.warning(
      "Impulse init targets patch-to-patch attention; the reference uses it only with global "
      "average pooling (no class token), but %s has pool='token'.",
      type(model).__name__,
    )
  solution = solve_impulse(
    solver_config(cfg),
    grid,
    dim,
    heads,
    head_dim,
    depth=len(paths),
    seed=seed,
    cache_dir=cfg["cache_dir"],
    batching=_solver_batching(model),
  )
  source = "cache" if solution.from_cache else f"{solution.solve_seconds:.1f}s"
  logging.info("Impulse init (%s, %s):\n%s", grid, source, solution.report())
  return write_impulse(params, solution, layout), solution


def _unbox(params: Any) -> tuple[Any, Any]:
  boxed = any(isinstance(x, nn.meta.AxisMetadata) for x in jax.tree.leaves(params, is_leaf=_meta))
  return (nn.meta.unbox(params), params) if boxed else (params, None)


def _meta(x) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def _rebox(values: Any, boxes: Any) -> Any:
  if boxes is None:
    return values
  return jax.tree.map(
    lambda box, new: box.replace_boxed(new) if _meta(box) else new, boxes, values, is_leaf=_meta
  )


def apply_init(
  init_cfg: Mapping[str, Any],
  params: Any,
  model: nn.Module | None = None,
  image_size: int | tuple[int, int] | None = None,
  *,
  seed: int | None = None,
  return_solution: bool = False,
  grid: TokenGrid | None = None,
) -> Any:
  """Returns ``params`` re-initialised per ``init_cfg`` (a ``config.init`` block).

  Args:
    init_cfg: mapping with ``name`` and that init's fields (see ``init_config``).
    params: the model's params tree (plain or boxed with logical axes; structure is kept).
    model: the Linen module (for 'impulse' without ``grid``: its ``patch_size`` gives the token
      grid).
    image_size: input side (or ``(height, width)``), needed for 'impulse' without ``grid``.
    seed: overrides ``init_cfg.seed`` (the trainer passes ``config.seed`` when ``init.seed`` is
      None); every draw is deterministic in it, 0 when neither is set.
    return_solution: also return the impulse solve (``locvit.init.ImpulseSolution``: the solved
      Q/K per layer, the target maps and their quality report) that was written into the
      params; ``None`` for the other inits.
    grid: the attention layers' token grid for 'impulse', in place of ``model`` and
      ``image_size`` (a model of one's own, without ``patch_size``).

  Returns host (NumPy) arrays with the input's structure and dtypes, or ``(params, solution)``
  with ``return_solution=True``.
  """
  init_cfg = _with_defaults(init_cfg)
  name = init_cfg["name"]
  if seed is None:
    seed = init_cfg["seed"]
  seed = 0 if seed is None else int(seed)
  values, boxes = _unbox(params)
  solution = None
  if name == "none":
    values, boxes = params, None
  elif name in BASELINES:
    values = apply_baseline(name, values, seed)
  else:
    values, solution = _structured(name, init_cfg, values, model, image_size, grid, seed)
  out = _rebox(values, boxes)
  return (out, solution) if return_solution else out


def _with_defaults(init_cfg: Mapping[str, Any]) -> dict[str, Any]:
  """``init_cfg`` as a dict with the fields it lacks from ``init_config(name)`` (name 'none' when
  absent); a block without ``cache_dir`` solves without a cache."""
  given = dict(init_cfg)
  name = given.setdefault("name", "none")
  check_choice("init.name", name, INIT_NAMES)
  full = defaults.init_config(name).to_dict()
  if "cache_dir" in full:
    full["cache_dir"] = None
  return {**full, **given}


def _structured(name: str, init_cfg: Mapping, values: Any, model, image_size, grid, seed: int):
  """Mimetic or impulse on unboxed ``values``: ``(new values, impulse solution or None)``."""

  base = init_cfg["base"]
  check_choice("init.base", base, BASES)
  layout = get_layout(init_cfg["qk_layout"], init_cfg["qk_pattern"])
  find_qk_kernels(flatten(values), layout)  # fail before any work on an unknown backbone
  values = apply_baseline(base, values, seed)
  if name == "mimetic":
    vproj = init_cfg["vproj"]
    check_choice("init.vproj", vproj, VPROJ_MODES)
    values = apply_mimetic(
      values,
      layout,
      seed=seed,
      **{k: init_cfg[k] for k in ("alpha", "beta", "v_alpha", "v_beta")},
      vproj=vproj,
    )
    return values, None
  if grid is None:
    if model is None or image_size is None:
      raise ValueError(
        "init.name='impulse' needs the token grid: pass grid=TokenGrid(H, W), or the model "
        "(with patch_size) and the image size."
      )
    grid = token_grid(model, image_size)
  elif not isinstance(grid, TokenGrid):
    raise ValueError(f"grid={grid!r} is not a TokenGrid: pass grid=TokenGrid(H, W).")
  return _impulse(init_cfg, values, model, grid, layout, seed)
