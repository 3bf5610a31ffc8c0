"""Generative baseline initializers applied to a params tree (the paper's Tables 2, 3, 6, 8).

- ``kaiming_uniform``: PyTorch's default ``nn.Linear`` / ``nn.Conv2d`` init ("Kaiming Uniform"
  in the paper): weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (``kaiming_uniform_`` with
  ``a = sqrt(5)``).
- ``trunc_normal``: timm's default ViT init ("Trunc Normal"): every Linear weight
  ~ trunc_normal(std 0.02, truncated at [-2, 2] absolute, as ``torch.nn.init.trunc_normal_``),
  Linear biases 0; timm leaves convolutions (the patch embedding) at PyTorch's default.

- ``xavier_normal``: the GMM paper's official ViT (``models/vit.py``, ``init_weights`` and the
  ``torch.randn`` embeddings): every Linear weight ~ N(0, 2 / (fan_in + fan_out))
  (``xavier_normal_``, not truncated), Linear biases 0, and the position embedding and class
  token ~ N(0, 1). The official patch embedding is a Linear on flattened patches, so the patch
  kernel's fan-out is its output width (a torch ``Conv2d`` would count the receptive field too).

The first two touch only parameters named ``kernel`` and the ``bias`` next to them; norms,
position embeddings and class tokens keep their values. ``xavier_normal`` also redraws
``pos_embed`` and ``cls_token``. ``fan_in`` follows the parameter layouts of locvit
(``attention.py``): the stacked ``(C, S, H, Dh)`` q/k/v kernel and ``(C, H, Dh)`` value kernels
have one input axis (``C``); the ``(H, Dh, C)`` output projection two; every other kernel all but
its last axis (Dense ``(in, out)``, Conv ``(kh, kw, in, out)``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from locvit.init.layout import Path, flatten, unflatten
from locvit.init.rng import numpy_rng, truncated_normal

# (regex on '/'-joined path, kernel ndim, number of leading input axes)
INPUT_AXES: tuple[tuple[str, int, int], ...] = (
  (r"(^|/)(qkv|qk)/kernel$", 4, 1),
  (r"(^|/)v/kernel$", 3, 1),
  (r"(^|/)proj/kernel$", 3, 2),
)
TIMM_STD = 0.02
TIMM_BOUND = 2.0


def input_axes(path: Path, shape: tuple[int, ...]) -> int:
  """How many leading axes of a kernel are input (fan-in) axes."""
  text = "/".join(path)
  for pattern, ndim, axes in INPUT_AXES:
    if len(shape) == ndim and re.search(pattern, text):
      return axes
  return len(shape) - 1


def fan_in(path: Path, shape: tuple[int, ...]) -> int:
  """PyTorch's fan-in of the kernel at ``path``: the product of its input axes."""
  return int(np.prod(shape[: input_axes(path, shape)]))


def fan_out(path: Path, shape: tuple[int, ...]) -> int:
  """The fan-out of the kernel at ``path`` as a Linear's: the product of its output axes."""
  return int(np.prod(shape[input_axes(path, shape) :]))


def is_conv(path: Path, shape: tuple[int, ...]) -> bool:
  """Convolution kernels: ``(kh, kw, in, out)`` with spatial (non-input-axis) layout."""
  return len(shape) == 4 and input_axes(path, shape) == 3


def _kernels(flat: dict[Path, Any]) -> list[Path]:
  return sorted(p for p in flat if p[-1] == "kernel")


def _bias(path: Path) -> Path:
  return (*path[:-1], "bias")


def _pytorch_default(flat, path, rng: np.random.Generator) -> None:
  """U(+-1/sqrt(fan_in)) weight and bias, in place on the flat dict."""
  kernel = flat[path]
  bound = 1.0 / np.sqrt(fan_in(path, kernel.shape))
  flat[path] = rng.uniform(-bound, bound, kernel.shape).astype(kernel.dtype)
  if _bias(path) in flat:
    bias = flat[_bias(path)]
    flat[_bias(path)] = rng.uniform(-bound, bound, bias.shape).astype(bias.dtype)


def _timm_linear(flat, path, rng: np.random.Generator) -> None:
  kernel = flat[path]
  flat[path] = truncated_normal(rng, TIMM_STD, TIMM_BOUND, kernel.shape).astype(kernel.dtype)
  if _bias(path) in flat:
    flat[_bias(path)] = np.zeros_like(flat[_bias(path)])


def _xavier_linear(flat, path, rng: np.random.Generator) -> None:
  """``torch.nn.init.xavier_normal_`` (gain 1) weight and a zero bias, in place on the flat dict."""
  kernel = flat[path]
  std = np.sqrt(2.0 / (fan_in(path, kernel.shape) + fan_out(path, kernel.shape)))
  flat[path] = rng.normal(0.0, std, kernel.shape).astype(kernel.dtype)
  if _bias(path) in flat:
    flat[_bias(path)] = np.zeros_like(flat[_bias(path)])


# Learned embeddings the GMM code draws with ``torch.randn`` (std 1).
RANDN_EMBEDDINGS = ("pos_embed", "cls_token")


def _apply(params: Any, seed: int, rule: Callable[[Path, tuple], Callable | None]) -> Any:
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  for path in _kernels(flat):
    init = rule(path, flat[path].shape)
    if init is not None:
      init(flat, path, numpy_rng(seed, "baseline", *path))
  return unflatten(flat, params)


def kaiming_uniform(params: Any, seed: int = 0) -> Any:
  """PyTorch's default init of every Linear and Conv kernel and its bias."""
  return _apply(params, seed, lambda path, shape: _pytorch_default)


def trunc_normal(params: Any, seed: int = 0) -> Any:
  """timm's ViT init: Linear kernels trunc_normal(0.02), zero biases; convs PyTorch default."""
  return _apply(
    params, seed, lambda path, shape: _pytorch_default if is_conv(path, shape) else _timm_linear
  )


def xavier_normal(params: Any, seed: int = 0) -> Any:
  """The GMM paper's ViT init: xavier-normal Linear kernels, zero biases, N(0, 1) embeddings."""
  params = _apply(params, seed, lambda path, shape: _xavier_linear)
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  for path, value in flat.items():
    if path[-1] in RANDN_EMBEDDINGS:
      rng = numpy_rng(seed, "baseline", *path)
      flat[path] = rng.standard_normal(value.shape).astype(value.dtype)
  return unflatten(flat, params)


BASELINES = {
  "kaiming_uniform": kaiming_uniform,
  "trunc_normal": trunc_normal,
  "xavier_normal": xavier_normal,
}
BASES = ("keep", *BASELINES)


def apply_baseline(name: str, params: Any, seed: int = 0) -> Any:
  """``name`` in ``BASELINES``, or 'keep' (unchanged). Deterministic in ``seed``."""
  if name == "keep":
    return params
  if name not in BASELINES:
    raise ValueError(f"Unknown base init {name!r}. Valid choices: {list(BASES)}.")
  return BASELINES[name](params, seed)
