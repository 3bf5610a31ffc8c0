"""Where a backbone keeps its attention projections: path patterns plus a kernel-layout adapter.

Initializers in this package write query/key (and, for mimetic init, value/output) kernels into a
params tree without knowing the model class. An ``AttentionLayout`` names them:

- ``qk_pattern``: a regex searched in '/'-joined parameter paths; every match is one attention
  layer's kernel holding q and k stacked as ``(C, S, H, Dh)`` (axis 1 indexes q, k[, v]). Layers
  are ordered by a natural sort of the paths ('blocks_2' before 'blocks_10').
- ``q_index``, ``k_index``: positions of q and k on axis 1; ``v_index``: of v when it is in the
  same stack (locvit's fused ``qkv``), else v is the sibling module ``v_module`` with a
  ``(C, H, Dh)`` kernel (ConViT's GPSA ``qk`` + ``v``).
- ``proj_module``: the sibling output projection with a ``(H, Dh, C)`` kernel.

``LAYOUTS`` has locvit's ViT ('vit') and ConViT ('convit'); pass another ``AttentionLayout`` (or
override the pattern) for other backbones.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import flax
import numpy as np

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class AttentionLayout:
  """Locates the attention kernels of one backbone family (see module docstring)."""

  name: str
  qk_pattern: str
  q_index: int = 0
  k_index: int = 1
  v_index: int | None = 2
  v_module: str | None = None
  proj_module: str | None = "proj"

  def with_pattern(self, pattern: str | None) -> AttentionLayout:
    """A copy whose ``qk_pattern`` is ``pattern`` (self when ``pattern`` is empty)."""
    return self if not pattern else dataclasses.replace(self, qk_pattern=pattern)


LAYOUTS = {
  "vit": AttentionLayout("vit", r"(^|/)blocks_\d+/attn/qkv/kernel$"),
  "convit": AttentionLayout("convit", r"(^|/)blocks_\d+/attn/qkv?/kernel$", v_module="v"),
}


def get_layout(layout: str | AttentionLayout, pattern: str | None = None) -> AttentionLayout:
  """A layout by name (or as given), with ``pattern`` replacing its ``qk_pattern`` if set."""
  if isinstance(layout, AttentionLayout):
    return layout.with_pattern(pattern)
  if layout not in LAYOUTS:
    raise ValueError(f"Unknown attention layout {layout!r}. Valid layouts: {sorted(LAYOUTS)}.")
  return LAYOUTS[layout].with_pattern(pattern)


def flatten(params: Any) -> dict[Path, Any]:
  """``{path tuple: leaf}`` of a (possibly frozen) params tree."""
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(params))


def unflatten(flat: dict[Path, Any], like: Any) -> Any:
  """Inverse of ``flatten``; frozen if ``like`` is a ``FrozenDict``."""
  tree = flax.traverse_util.unflatten_dict(flat)
  return flax.core.freeze(tree) if isinstance(like, flax.core.FrozenDict) else tree


def _natural_key(path: Path) -> list:
  text = "/".join(path)
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def find_qk_kernels(flat: dict[Path, Any], layout: AttentionLayout) -> list[Path]:
  """Paths of the stacked q/k kernels, in layer order; a clear error when there are none."""
  regex = re.compile(layout.qk_pattern)
  found = [p for p in flat if regex.search("/".join(p))]
  if not found:
    examples = sorted("/".join(p) for p in flat)[:12]
    raise ValueError(
      f"No query/key kernels found: looked for parameter paths matching {layout.qk_pattern!r} "
      f"(layout {layout.name!r}: kernels of shape (C, S, H, Dh) with q at index {layout.q_index} "
      f"and k at index {layout.k_index} of axis 1). Paths in this tree include: {examples}. "
      "Pass init.qk_layout / init.qk_pattern for this backbone."
    )
  for path in found:
    shape = np.shape(flat[path])
    if len(shape) != 4 or shape[1] <= max(layout.q_index, layout.k_index):
      raise ValueError(
        f"{'/'.join(path)} has shape {shape}; layout {layout.name!r} expects a (C, S, H, Dh) "
        f"kernel with q at index {layout.q_index} and k at index {layout.k_index} of axis 1."
      )
  return sorted(found, key=_natural_key)


def attention_dims(flat: dict[Path, Any], paths: list[Path]) -> tuple[int, int, int]:
  """``(C, H, Dh)`` shared by all layers; an error if the layers differ."""
  shapes = {tuple(np.shape(flat[p])[i] for i in (0, 2, 3)) for p in paths}
  if len(shapes) != 1:
    raise ValueError(f"Attention layers have different (C, H, Dh) shapes {sorted(shapes)}.")
  return shapes.pop()


def sibling(path: Path, module: str) -> Path:
  """``.../attn/qkv/kernel`` -> ``.../attn/<module>/kernel``."""
  return (*path[:-2], module, path[-1])


def set_qk(kernel: Any, layout: AttentionLayout, q: np.ndarray, k: np.ndarray) -> np.ndarray:
  """Writes per-head ``(C, H, Dh)`` query and key kernels into a stacked kernel."""
  out = np.array(kernel, copy=True)
  out[:, layout.q_index] = np.asarray(q, out.dtype)
  out[:, layout.k_index] = np.asarray(k, out.dtype)
  return out


def value_path(flat: dict[Path, Any], path: Path, layout: AttentionLayout) -> tuple[Path, bool]:
  """(path, stacked): where this layer's value kernel lives."""
  if layout.v_index is not None and np.shape(flat[path])[1] > layout.v_index:
    return path, True
  if layout.v_module is None:
    raise ValueError(f"Layout {layout.name!r} does not locate the value kernel of {path}.")
  vpath = sibling(path, layout.v_module)
  if vpath not in flat:
    raise ValueError(f"Value kernel {'/'.join(vpath)} not found (layout {layout.name!r}).")
  return vpath, False
