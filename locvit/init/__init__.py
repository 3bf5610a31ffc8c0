"""Initializers applied to a params tree after ``model.init`` (structured-initialization paper).

>>> config.init = init_config('impulse', filter_size=3, mode='different')
>>> params = apply_init(config.init, params, model, image_size)

A model or layer of one's own (no ``patch_size``): pass its token grid, and the pattern of its
stacked ``(C, 3, H, Dh)`` q/k kernels where they are not at ``blocks_<i>/attn/qkv``:

>>> cfg = init_config('impulse', qk_pattern=r'qkv/kernel$')
>>> params = apply_init(cfg, Attention(4).init(key, x, grid=grid)['params'], grid=grid)

- ``impulse``: the backbone-agnostic impulse solver (Algorithm 1), ``solve_impulse``;
- ``mimetic``: Trockman & Kolter's mimetic init, ``apply_mimetic``;
- ``baselines``: PyTorch-default (Kaiming-uniform) and timm (trunc-normal) inits;
- ``layout``: where a backbone's q/k/v/proj kernels live (``AttentionLayout``, ``LAYOUTS``).
"""

from locvit.configs.defaults import INIT_NAMES
from locvit.init.apply import (
  apply_init,
  check_init_config,
  init_config,
  token_grid,
  write_impulse,
)
from locvit.init.baselines import apply_baseline, kaiming_uniform, trunc_normal
from locvit.init.impulse import ImpulseSolution, SolverConfig, solve_impulse, solver_config
from locvit.init.layout import LAYOUTS, AttentionLayout, find_qk_kernels, get_layout
from locvit.init.mimetic import apply_mimetic, mimetic_qk, mimetic_vproj
from locvit.init.pseudo_inputs import PSEUDO_INPUTS, pseudo_input
from locvit.init.targets import impulse_attention_matrix, impulse_key_indices

__all__ = [
  "INIT_NAMES",
  "LAYOUTS",
  "PSEUDO_INPUTS",
  "AttentionLayout",
  "ImpulseSolution",
  "SolverConfig",
  "apply_baseline",
  "apply_init",
  "apply_mimetic",
  "check_init_config",
  "find_qk_kernels",
  "get_layout",
  "impulse_attention_matrix",
  "impulse_key_indices",
  "init_config",
  "kaiming_uniform",
  "mimetic_qk",
  "mimetic_vproj",
  "pseudo_input",
  "solve_impulse",
  "solver_config",
  "token_grid",
  "trunc_normal",
  "write_impulse",
]
