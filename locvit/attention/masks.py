"""Gaussian mixture masks (GMM) and element-wise learnable masks (ELM) on attention logits.

Li & Zhang, "Toward a Deeper Understanding: RetNet Viewed through Convolution". A mask ``M`` of
shape ``(H, N, N)`` (no batch dimension) enters the attention through the seam of
``locvit.attention.Attention``:

- ``combine='multiply'`` (default, faithful): ``softmax((q k^T / sqrt(d)) * M) v`` -- Eq. 9, and
  what the official code does (``Gaussian_Mixture_Mask.forward`` returns ``attn * x``).
- ``combine='add'``: ``softmax(q k^T / sqrt(d) + M) v`` -- the paper text's "we simply add the
  obtained GMM"; runs in the fused ``dot_product_attention`` kernel (its ``bias``).

GMM (Eq. 1, Algorithm 1), per layer and head ``h``, with ``K`` kernels and ``d^2 = dx^2 + dy^2``
the squared distance between query and key on the token grid:

- ``kernel='faithful'`` (official code): ``M_h = sum_k alpha_kh * B ** (1 / (sigma_kh^2 + 1e-5))``
  with the base table ``B = exp(-d^2) ** 0.5`` computed in float32 once per grid. In float32,
  ``exp(-d^2)`` is exactly 0 for ``d^2 >= 104`` (below half the smallest subnormal), so on grids
  of 9x9 and larger the far entries of ``B`` -- and of ``M``, whatever sigma is -- are exactly 0
  (16x16: 21,792 of 65,536 entries). An 8x8 grid (CIFAR at patch 4) is unaffected.
- ``kernel='intended'``: ``M_h = sum_k alpha_kh * exp(-d^2 / (2 (sigma_kh^2 + 1e-5)))``, the same
  function in exact arithmetic, with no underflow (far entries stay positive).

Initialisation (Sec. 4.2): ``alpha ~ N(0, 2^2)``, ``sigma ~ N(10, 10^2)``, both of shape ``(K, H)``,
so GMM adds ``2 K H`` parameters per layer.

ELM (Sec. 3.1): one ``(N, N)`` parameter per layer shared by the heads, initialised to zeros as
in the official ``Simple_Mask``; multiplied into the logits, so at init every logit is 0 and the
attention is uniform.

The paper defines both masks on a square ``N^(1/2) x N^(1/2)`` grid (Eq. 2). The geometry here is
well defined on any ``h x w`` grid; pass ``allow_non_square=True`` to use it there.

Attention kinds ``'gmm'`` and ``'elm'`` are registered: ``Attention`` with the mask as its
positional term (child ``mask``), configured through a backbone's ``attention_kwargs``, e.g.
``{'gmm': {'num_kernels': 5, 'kernel': 'faithful', 'combine': 'multiply'}}``. Swin's windows,
CaiT's talking heads and T2T's token transformer build the mask with ``mask_terms`` and hand it
to the same ``Attention`` as a ``Term``. The table is computed once per call from NumPy
constants: no batch dimension.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention.attention import Attention, register_attention
from locvit.attention.core import Term
from locvit.attention.geometry import TokenGrid, squared_distances
from locvit.attention.projections import normal_init, partitioned
from locvit.platform.ops import cpu_kernels

Array = jax.Array
Kernel = Literal["faithful", "intended"]
KERNELS = ("faithful", "intended")
MASK_COMBINE = ("multiply", "add")
MASK_KINDS = ("gmm", "elm")
SIGMA_EPS = 1e-5  # the official code's epsilon in 1 / (sigma^2 + eps)


# ---------------------------------------------------------------------------------------------
# Tables computed once per grid (NumPy constants, never per example).


@functools.lru_cache(maxsize=64)
def distance_levels(grid: TokenGrid) -> tuple[np.ndarray, np.ndarray]:
  """Distinct squared distances ``levels`` (D,) and ``index`` (N, N) with ``d2 = levels[index]``.

  A GMM table only depends on ``d^2``, which takes few distinct values (34 on 8x8), so on the
  CPU code paths the kernels are evaluated on ``(K, H, D)`` and gathered to ``(H, N, N)``.
  """
  levels, index = np.unique(squared_distances(grid), return_inverse=True)
  levels = levels.astype(np.float32)
  index = index.reshape(grid.num_tokens, grid.num_tokens).astype(np.int32)
  levels.setflags(write=False)
  index.setflags(write=False)
  return levels, index


def faithful_base(d2: np.ndarray) -> np.ndarray:
  """``exp(-d^2) ** 0.5`` in float32 NumPy, subnormals kept (as NumPy and PyTorch on CPU do).

  The base of Li & Zhang's Eq. 1 in the official code's form, raised there to
  ``1 / (sigma^2 + 1e-5)``.

  Computed in NumPy rather than XLA, whose CPU backend flushes subnormals to zero and would add
  zeros for ``87 < d^2 < 104`` that the official code does not have.
  """
  return np.exp(-np.asarray(d2, np.float32)) ** np.float32(0.5)


@functools.lru_cache(maxsize=64)
def gaussian_base_table(grid: TokenGrid) -> np.ndarray:
  """The official base table ``B = exp(-d^2) ** 0.5`` of shape (N, N), float32 (read-only)."""
  out = faithful_base(squared_distances(grid))
  out.setflags(write=False)
  return out


def gaussian_mixture(
  alpha: Array, sigma: Array, grid: TokenGrid, kernel: Kernel, gather: bool = False
) -> Array:
  """GMM table ``(H, N, N)`` from ``alpha``, ``sigma`` of shape ``(K, H)`` (Li & Zhang Eq. 1 and
  Algorithm 1; the 'faithful' / 'intended' kernels are described in the module docstring).

  Evaluated in float32 on every query-key pair of ``grid``, or with ``gather`` on its distinct
  distances and gathered to the full table: the same numbers, with ~100x fewer evaluations
  (the CPU code paths' choice) but, on XLA:GPU, a gather kernel before and a scatter kernel after
  that the elementwise table fuses without (docs/benchmarks.md, "A block's small kernels").
  """
  if kernel not in KERNELS:
    raise ValueError(f"GMM kernel={kernel!r} is not one of {KERNELS}.")
  levels, index = distance_levels(grid)
  d2 = levels[:, None] if gather else levels[index]  # (D, 1) or (N, N)
  alpha = alpha.astype(jnp.float32)[..., None, None]
  sigma2 = jnp.square(sigma.astype(jnp.float32))[..., None, None] + SIGMA_EPS
  if kernel == "faithful":
    # jnp.power's gradient w.r.t. the exponent is 0 (not NaN) where the base is exactly 0.
    per_kernel = jnp.power(jnp.asarray(faithful_base(d2)), 1.0 / sigma2)
  else:
    per_kernel = jnp.exp(-jnp.asarray(d2) / (2.0 * sigma2))
  table = jnp.sum(alpha * per_kernel, axis=0)  # (H, D, 1) or (H, N, N)
  return table[:, jnp.asarray(index), 0] if gather else table


# ---------------------------------------------------------------------------------------------
# Mask modules: positional terms ``term(grid) -> (H, N, N)``.


def check_grid(grid: TokenGrid, allow_non_square: bool, what: str) -> None:
  """Raises ValueError on a non-square grid unless ``allow_non_square`` (Li & Zhang Eq. 2)."""
  if not allow_non_square:
    grid.require_square(
      f"{what} (Li & Zhang Eq. 2 is defined on a square grid; set "
      "allow_non_square=True to use the rectangular geometry)"
    )


def check_num_kernels(num_kernels: int) -> None:
  """Raises ValueError unless ``num_kernels`` (K of Eq. 1) is an int >= 1."""
  if not isinstance(num_kernels, int) or num_kernels < 1:
    raise ValueError(
      f"GMM needs num_kernels >= 1 Gaussian kernels per head, got {num_kernels!r} "
      "(the paper uses 5; Fig. 6 sweeps 1..10)."
    )


class GaussianMixtureMask(nn.Module):
  """Li & Zhang's multi-head Gaussian mixture mask (Sec. 3.2, Eq. 1 / Algorithm 1), ``(H, N, N)``
  per call; init of Sec. 4.2.

  Attributes:
    num_heads: H; each head has its own K kernels.
    num_kernels: K >= 1 (5 in the paper).
    kernel: 'faithful' (official pow form, float32 underflow included) or 'intended'.
    alpha_std, sigma_mean, sigma_std: init ``alpha ~ N(0, alpha_std^2)``,
      ``sigma ~ N(sigma_mean, sigma_std^2)`` (Sec. 4.2: 2, 10, 10).
    allow_non_square: use the rectangular geometry on ``h != w`` grids instead of raising.
    implementation: the model's kernel setting (``locvit.platform.ops``); 'cpu_kernels' evaluates
    the
      kernels on the grid's distinct distances (``gaussian_mixture``'s ``gather``).

    param_dtype: dtype of ``alpha`` and ``sigma``; the table is computed in float32.

  Parameters ``alpha`` and ``sigma`` have shape ``(K, H)``. The table is sown as the
  ``'table'`` intermediate when the caller collects intermediates.
  """

  num_heads: int
  num_kernels: int = 5
  kernel: Kernel = "faithful"
  alpha_std: float = 2.0
  sigma_mean: float = 10.0
  sigma_std: float = 10.0
  allow_non_square: bool = False
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  def __post_init__(self):
    check_num_kernels(self.num_kernels)
    if self.kernel not in KERNELS:
      raise ValueError(f"GMM kernel={self.kernel!r} is not one of {KERNELS}.")
    super().__post_init__()

  @nn.compact
  def __call__(self, grid: TokenGrid) -> Array:
    check_grid(grid, self.allow_non_square, "The Gaussian mixture mask")
    shape = (self.num_kernels, self.num_heads)
    names = (None, "heads")
    alpha = self.param(
      "alpha", partitioned(normal_init(self.alpha_std), names), shape, self.param_dtype
    )
    sigma = self.param(
      "sigma",
      partitioned(normal_init(self.sigma_std, self.sigma_mean), names),
      shape,
      self.param_dtype,
    )
    gather = cpu_kernels(self.implementation)
    table = gaussian_mixture(alpha, sigma, grid, self.kernel, gather)
    self.sow("intermediates", "table", table)
    return table


class ElementwiseMask(nn.Module):
  """Li & Zhang's element-wise learnable mask (Sec. 3.1): one ``(N, N)`` parameter shared by the
  H heads.

  Attributes:
    num_heads: H (the table is broadcast to every head).
    allow_non_square: use the mask on ``h != w`` grids instead of raising.
    elm_init: initializer of the ``elm`` parameter; zeros as the official ``Simple_Mask``.
    param_dtype: dtype of ``elm``; the table is float32.

  The ``(H, N, N)`` table is sown as the ``'table'`` intermediate.
  """

  num_heads: int
  allow_non_square: bool = False
  elm_init: Callable = nn.initializers.zeros
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, grid: TokenGrid) -> Array:
    check_grid(grid, self.allow_non_square, "The element-wise learnable mask")
    n = grid.num_tokens
    weights = self.param("elm", partitioned(self.elm_init, (None, None)), (n, n), self.param_dtype)
    table = jnp.broadcast_to(weights.astype(jnp.float32), (self.num_heads, n, n))
    self.sow("intermediates", "table", table)
    return table


MASK_MODULES: dict[str, type[nn.Module]] = {"gmm": GaussianMixtureMask, "elm": ElementwiseMask}


def mask_options(kind: str) -> tuple[str, ...]:
  """Options accepted in ``attention_kwargs[kind]`` by the mask kinds (plus ``combine``)."""
  if kind not in MASK_MODULES:
    raise ValueError(f"Unknown mask kind {kind!r}. Valid kinds: {MASK_KINDS}.")
  fields = {f.name for f in dataclasses.fields(MASK_MODULES[kind])}
  internal = {"num_heads", "param_dtype", "implementation", "parent", "name"}
  return (*sorted(fields - internal), "combine")


def split_mask_options(kind: str, options: Mapping[str, Any] | None) -> tuple[dict, str]:
  """Validates ``options`` for mask ``kind``; returns ``(module options, combine)``."""
  options = dict(options or {})
  valid = mask_options(kind)
  bad = sorted(set(options) - set(valid))
  if bad:
    raise ValueError(f"Mask kind {kind!r} has no options {bad}. Valid options: {list(valid)}.")
  combine = options.pop("combine", "multiply")
  if combine not in MASK_COMBINE:
    raise ValueError(f"{kind} combine={combine!r} is not one of {MASK_COMBINE}.")
  if kind == "gmm":
    check_num_kernels(options.get("num_kernels", 5))
    if options.get("kernel", "faithful") not in KERNELS:
      raise ValueError(f"GMM kernel={options['kernel']!r} is not one of {KERNELS}.")
  return options, combine


def mask_terms(
  kind: str,
  num_heads: int,
  grid: TokenGrid,
  options: Mapping[str, Any] | None = None,
  implementation: str | None = None,
) -> tuple[Term, ...]:
  """The attention-core term of mask ``kind`` ('gmm' | 'elm') on ``grid``; ``()`` for 'mhsa'.

  For Swin's windows, CaiT's talking heads and T2T's token transformer; call it inside a compact
  method: the mask module becomes the caller's child ``mask``. ``implementation``: the caller's
  kernel setting (``locvit.platform.ops``).
  """
  if kind not in MASK_KINDS:
    return ()
  module_options, combine = split_mask_options(kind, options)
  if kind == "gmm":
    module_options["implementation"] = implementation
  mask = MASK_MODULES[kind](num_heads=num_heads, name="mask", **module_options)
  return (Term(mask(grid), combine),)


def mask_attention_kwargs(
  mask: str, num_kernels: int = 5, kernel: Kernel = "faithful", combine: str = "multiply"
) -> dict[str, dict[str, Any]]:
  """A backbone's ``attention_kwargs`` for a mask kind: ``{'gmm': {...}}`` or ``{'elm': {...}}``."""
  if mask == "gmm":
    return {"gmm": {"num_kernels": num_kernels, "kernel": kernel, "combine": combine}}
  if mask == "elm":
    return {"elm": {"combine": combine}}
  raise ValueError(f"Unknown mask {mask!r}. Valid masks: {MASK_KINDS}.")


# ---------------------------------------------------------------------------------------------
# Attention kinds 'gmm' and 'elm': the shared Attention with the mask as its positional term.


def _check_mask_combine(kind: str, layer: Attention) -> None:
  if layer.positional is not None:
    raise ValueError(f"Attention kind {kind!r} builds its own mask; drop positional=.")
  if layer.combine not in MASK_COMBINE:
    raise ValueError(f"{kind} combine={layer.combine!r} is not one of {MASK_COMBINE}.")


def _mask_grid(kind: str, grid: TokenGrid | None) -> TokenGrid:
  if grid is None:
    raise ValueError(f"Attention kind {kind!r} needs the token grid (grid=TokenGrid).")
  return grid


class GMMAttention(Attention):
  """Multi-head GMM attention (Li & Zhang Sec. 3.3, Eq. 9: ``softmax((q k^T / sqrt(d)) * M) v``);
  attention kind 'gmm'. ``Attention`` with a ``GaussianMixtureMask`` child named ``mask``.

  Attributes (besides ``Attention``'s; ``positional`` stays None: the layer builds its mask):
    combine: 'multiply' (Eq. 9, the official code) or 'add' (Sec. 3.3's "simply add"; runs in
      the fused kernel).
    num_kernels, kernel, alpha_std, sigma_mean, sigma_std, allow_non_square: the mask's fields
      (``GaussianMixtureMask``: K of Eq. 1, 'faithful' / 'intended', the Sec. 4.2 init, the
      rectangular geometry on ``h != w`` grids).
  """

  mask_kind: ClassVar[str] = "gmm"
  combine: Literal["multiply", "add"] = "multiply"
  allow_non_square: bool = False
  num_kernels: int = 5
  kernel: Kernel = "faithful"
  alpha_std: float = 2.0
  sigma_mean: float = 10.0
  sigma_std: float = 10.0

  def __post_init__(self):
    check_num_kernels(self.num_kernels)
    if self.kernel not in KERNELS:
      raise ValueError(f"GMM kernel={self.kernel!r} is not one of {KERNELS}.")
    _check_mask_combine(self.mask_kind, self)
    super().__post_init__()

  def _positional_table(self, grid: TokenGrid | None) -> Array:
    return GaussianMixtureMask(
      self.num_heads,
      self.num_kernels,
      self.kernel,
      self.alpha_std,
      self.sigma_mean,
      self.sigma_std,
      self.allow_non_square,
      self.param_dtype,
      self.implementation,
      name="mask",
    )(_mask_grid(self.mask_kind, grid))


class ELMAttention(Attention):
  """Attention with Li & Zhang's element-wise learnable mask (Sec. 3.1) on the logits, applied as
  in Eq. 9 (attention kind 'elm'). ``Attention`` with an ``ElementwiseMask`` child ``mask``.

  Attributes (besides ``Attention``'s; ``positional`` stays None):
    combine: 'multiply' (as Eq. 9 applies a mask; the official code) or 'add'.
    allow_non_square: use the mask on ``h != w`` grids instead of raising.
  """

  mask_kind: ClassVar[str] = "elm"
  combine: Literal["multiply", "add"] = "multiply"
  allow_non_square: bool = False

  def __post_init__(self):
    _check_mask_combine(self.mask_kind, self)
    super().__post_init__()

  def _positional_table(self, grid: TokenGrid | None) -> Array:
    mask = ElementwiseMask(
      self.num_heads, self.allow_non_square, param_dtype=self.param_dtype, name="mask"
    )
    return mask(_mask_grid(self.mask_kind, grid))


def _factory(cls: type[GMMAttention] | type[ELMAttention]) -> Callable[..., nn.Module]:
  """A factory that names the valid options when ``attention_kwargs`` has a typo."""
  valid = {f.name for f in dataclasses.fields(cls)} - {"parent"}

  def build(**kwargs: Any) -> nn.Module:
    bad = sorted(set(kwargs) - valid)
    if bad:
      options = sorted(set(mask_options(cls.mask_kind)) | {"allow_non_square"})
      raise ValueError(
        f"Attention kind {cls.mask_kind!r} has no options {bad}. Valid options: {options}."
      )
    return cls(**kwargs)

  build.__doc__ = cls.__doc__
  return build


register_attention("gmm")(_factory(GMMAttention))
register_attention("elm")(_factory(ELMAttention))
