"""Building blocks shared by the transformer backbones."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention import TokenGrid, get_attention
from locvit.attention.projections import DenseGeneral, partitioned, trunc_normal, zeros
from locvit.platform.ops import (
  bias_in_matmul,
  broadcast_per_example,
  cast_parameter,
  contract,
  cpu_kernels,
  dense_dot_general,
  promote_parameters,
)

Array = jax.Array


def check_patchable(height: int, width: int, patch_size: int) -> TokenGrid:
  """Returns the token grid, or a clear error when the image does not tile into patches."""
  if height % patch_size or width % patch_size:
    raise ValueError(
      f"Image size {height}x{width} is not divisible by patch_size={patch_size}. "
      f"Valid sizes are multiples of {patch_size} (e.g. {patch_size * (height // patch_size)} "
      f"or {patch_size * (height // patch_size + 1)})."
    )
  return TokenGrid(height // patch_size, width // patch_size)


def patchify(images: Array, patch_size: int) -> Array:
  """``(B, H, W, C)`` images -> ``(B, H/p * W/p, p * p * C)`` row-major patches, each flattened
  in ``(row, column, channel)`` order: the order of a ``(p, p, C, D)`` HWIO conv kernel."""
  b, height, width, channels = images.shape
  p = patch_size
  x = images.reshape(b, height // p, p, width // p, p, channels)
  x = jnp.transpose(x, (0, 1, 3, 2, 4, 5))
  return x.reshape(b, (height // p) * (width // p), p * p * channels)


class PatchFields(nn.Module):
  """Fields of the patch embedding: ``patch_size`` x ``patch_size`` patches to ``embed_dim``.

  Attributes:
    patch_size, embed_dim: the patch side and the token width.
    dtype, param_dtype: computation and parameter dtypes.
    implementation: the model's kernel setting (``locvit.platform.ops``): 'cpu_kernels' patchifies
    and
      multiplies, the others run ``lax.conv``.
  """

  patch_size: int
  embed_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None


class PatchProjection(PatchFields):
  """A ``patch_size`` x ``patch_size``, stride ``patch_size`` convolution with ``nn.Conv``'s
  parameters (``kernel`` ``(p, p, C, embed_dim)`` HWIO, lecun-normal; ``bias`` zeros).

  On the CPU code paths (``implementation='cpu_kernels'``, ``locvit.platform.ops``) it runs as
  ``patchify(images) @ kernel.reshape(p * p * C, D)``: the same numbers as the convolution, faster
  on XLA:CPU (``benchmarks/attention_kernels.py --sections=patch``); otherwise
  ``lax.conv_general_dilated``.
  """

  @nn.compact
  def __call__(self, images: Array) -> Array:
    p, channels = self.patch_size, images.shape[-1]
    kernel = self.param(
      "kernel",
      partitioned(nn.initializers.lecun_normal(), (None, None, None, "embed")),
      (p, p, channels, self.embed_dim),
      self.param_dtype,
    )
    bias = self.param("bias", partitioned(zeros, ("embed",)), (self.embed_dim,), self.param_dtype)
    images, kernel, bias = (
      images.astype(self.dtype),
      cast_parameter(kernel, self.dtype),
      cast_parameter(bias, self.dtype),
    )
    if cpu_kernels(self.implementation):
      flat_kernel = kernel.reshape(p * p * channels, self.embed_dim)
      tokens = contract(patchify(images, p), flat_kernel, flatten=True)
    else:
      y = jax.lax.conv_general_dilated(
        images, kernel, (p, p), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
      )
      tokens = y.reshape(y.shape[0], -1, self.embed_dim)
    return tokens + bias


class PatchEmbed(PatchFields):
  """Non-overlapping ``patch_size`` convolution from NHWC images to ``(B, N, D)`` tokens."""

  @nn.compact
  def __call__(self, images: Array) -> tuple[Array, TokenGrid]:
    _, height, width, _ = images.shape
    grid = check_patchable(height, width, self.patch_size)
    fields = (self.patch_size, self.embed_dim, self.dtype, self.param_dtype, self.implementation)
    return PatchProjection(*fields, name="proj")(images), grid


def sincos_2d_position_embedding(grid: TokenGrid, dim: int, temperature: float = 10000.0):
  """Fixed 2-D sin-cos encoding ``[sin(y w), sin(x w), cos(y w), cos(x w)]`` of shape (N, dim).

  ``w_k = 1 / temperature^(k / (dim / 4))`` for ``k = 0 .. dim/4 - 1`` on integer (row, col)
  coordinates, as in the structured-initialization reference (timm fork).
  """
  if dim % 4:
    raise ValueError(f"sin-cos position embedding needs embed_dim divisible by 4, got {dim}.")
  quarter = dim // 4
  omega = 1.0 / temperature ** (np.arange(quarter, dtype=np.float64) / quarter)
  rows, cols = np.divmod(np.arange(grid.num_tokens), grid.width)
  y = rows[:, None] * omega[None]
  x = cols[:, None] * omega[None]
  return np.concatenate([np.sin(y), np.sin(x), np.cos(y), np.cos(x)], axis=1).astype(np.float32)


_SQRT_HALF = float(np.sqrt(0.5))
_INV_SQRT_2PI = float(1.0 / np.sqrt(2.0 * np.pi))


@jax.custom_jvp
def gelu(x: Array) -> Array:
  """Exact GELU ``x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))``, the formula of ``torch.nn.GELU``.

  Same function as ``jax.nn.gelu(x, approximate=False)`` (which goes through ``erfc``; the two
  differ by float rounding only, about 1e-7). The custom JVP is for speed: the derivative
  ``Phi(x) + x * phi(x)`` is formed once in the forward pass and saved for the backward pass in
  place of the pre-activation, so the backward pass is one multiply. With autodiff through
  ``erfc`` (a branchy polynomial on XLA CPU), the training step of DeiT-Ti on CPU spends about
  twice as long in GELU (``benchmarks/convit_throughput.py``, docs/benchmarks.md).
  """
  return x * (0.5 + 0.5 * jax.lax.erf(x * _SQRT_HALF)).astype(x.dtype)


@gelu.defjvp
def _gelu_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  cdf = 0.5 + 0.5 * jax.lax.erf(x * _SQRT_HALF)
  derivative = cdf + x * jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
  return (x * cdf).astype(x.dtype), (dx * derivative).astype(dx.dtype)


class Mlp(nn.Module):
  """fc1 -> exact (erf) GELU -> dropout -> fc2 -> dropout.

  Attributes:
    hidden_dim: width of ``fc1``; ``fc2`` maps back to the input width.
    drop: dropout rate after the GELU and after ``fc2``.
    dtype, param_dtype: computation and parameter dtypes.
    implementation: the model's kernel setting (``locvit.platform.ops``).
  """

  hidden_dim: int
  drop: float = 0.0
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  @nn.compact
  def __call__(self, x: Array, train: bool = False, row_scale: Array | None = None) -> Array:
    """``row_scale``: ``(B, 1, 1)`` factors of the output, applied inside ``fc2``'s matmul
    (stochastic depth folded in, ``mlp_residual``): in a step compiled for XLA:GPU only."""
    dim = x.shape[-1]
    settings = (self.dtype, self.param_dtype, self.implementation)
    x = dense(self.hidden_dim, ("embed", "mlp"), "fc1", *settings)(x)
    x = gelu(x)
    x = nn.Dropout(self.drop)(x, deterministic=not train)
    fc2 = dense(dim, ("mlp", "embed"), "fc2", *settings)
    x = fc2(x) if row_scale is None else fc2(x, row_scale=row_scale)
    return nn.Dropout(self.drop)(x, deterministic=not train)


def dense(
  features: int,
  names: tuple[str | None, str | None],
  name: str,
  dtype: Any,
  param_dtype: Any,
  implementation: str | None,
  kernel_init: Callable = trunc_normal,
  bias_init: Callable = zeros,
  **kwargs: Any,
) -> nn.Module:
  """``nn.Dense`` (trunc-normal(0.02) weights and zero biases by default) on logical axes
  ``names``, on the CPU code paths with their ``dot_general`` (``locvit.platform.ops``). Under the
  other kernel settings the same parameters (names, shapes, initial values) in a ``DenseGeneral``,
  which adds the bias inside the matmul in a training step compiled for XLA:GPU (``ops.affine``:
  one kernel fewer per layer's gradient)."""
  if not cpu_kernels(implementation):
    return DenseGeneral(
      (features,),
      names,
      kernel_init=kernel_init,
      bias_init=bias_init,
      implementation=implementation,
      dtype=dtype,
      param_dtype=param_dtype,
      name=name,
      **kwargs,
    )
  return nn.Dense(
    features,
    dtype=dtype,
    param_dtype=param_dtype,
    kernel_init=partitioned(kernel_init, names),
    bias_init=partitioned(bias_init, names[1:]),
    dot_general=dense_dot_general(implementation),
    promote_dtype=promote_parameters,
    name=name,
    **kwargs,
  )


def classifier_head(
  num_classes: int,
  dtype: Any,
  param_dtype: Any,
  name: str = "head",
  kernel_init: Callable = trunc_normal,
  bias_init: Callable = zeros,
) -> nn.Dense:
  """The linear classifier ``head`` (trunc-normal 0.02 weights, zero bias unless given)."""
  return nn.Dense(
    num_classes,
    dtype=dtype,
    param_dtype=param_dtype,
    kernel_init=partitioned(kernel_init, ("embed", "classes")),
    bias_init=partitioned(bias_init, ("classes",)),
    promote_dtype=promote_parameters,
    name=name,
  )


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def normalize(x: Array, scale: Array, bias: Array, eps: float, dtype: Any) -> Array:
  """LayerNorm over the last axis, ``(x - mean) / sqrt(var + eps) * scale + bias`` in ``dtype``:
  ``torch.nn.LayerNorm``'s function, with float32 statistics and the two-pass variance
  ``mean((x - mean)^2)`` (flax's ``nn.LayerNorm(use_fast_variance=False)``).

  Its derivative is written out (``_normalize_jvp``) so that XLA fuses the backward pass JAX
  transposes from it into few kernels; forward mode (``jax.jvp``, ``jax.hessian``) works too.
  """
  return _normalized(x, scale, bias, eps)[0].astype(dtype)


def _normalized(x, scale, bias, eps):
  """``(y, xhat, rstd)`` in float32: the output, ``(x - mean) * rstd`` and ``rstd``."""
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  rstd = jax.lax.rsqrt(jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True) + eps)
  xhat = (x32 - mean) * rstd
  return xhat * scale.astype(jnp.float32) + bias.astype(jnp.float32), xhat, rstd


@normalize.defjvp
def _normalize_jvp(eps, dtype, primals, tangents):
  """``dy = rstd * (dx - mean(dx) - xhat * mean(dx * xhat)) * scale + xhat * dscale + dbias``:
  transposed, the closed-form backward pass (two row sums fused with ``dx``; the scale and bias
  gradients one reduction of ``dy * xhat`` and ``dy`` stacked)."""
  (x, scale, bias), (dx, dscale, dbias) = primals, tangents
  y, xhat, rstd = _normalized(x, scale, bias, eps)
  dx = dx.astype(jnp.float32)
  dxhat = rstd * (
    dx - jnp.mean(dx, axis=-1, keepdims=True) - xhat * jnp.mean(dx * xhat, axis=-1, keepdims=True)
  )
  affine = jnp.stack([dscale, dbias]).astype(jnp.float32)  # (2, C): one contraction with (xhat, 1)
  affine = broadcast_per_example(affine, xhat.shape[:-1])
  dy = dxhat * scale.astype(jnp.float32) + jnp.sum(
    jnp.stack([xhat, jnp.ones_like(xhat)], axis=-2) * affine, axis=-2
  )
  return y.astype(dtype), dy.astype(dtype)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis (``normalize``) with ``nn.LayerNorm``'s parameters: ``scale``
  (ones) and ``bias`` (zeros), float32, partitioned on the logical 'embed' axis.

  Attributes:
    epsilon: added to the variance.
    dtype: computation dtype; None: the inputs' and parameters' result type, as ``nn.LayerNorm``.
  """

  epsilon: float
  dtype: Any = None  # None: the inputs' and parameters' result type, as nn.LayerNorm

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = (x.shape[-1],)
    scale = self.param("scale", partitioned(nn.initializers.ones, ("embed",)), features)
    bias = self.param("bias", partitioned(zeros, ("embed",)), features)
    dtype = self.dtype or jnp.result_type(x, scale)
    return normalize(x, scale, bias, self.epsilon, dtype)


def layer_norm(eps: float, dtype: Any, name: str) -> LayerNorm:
  """The backbones' LayerNorm with ``eps``, computing in ``dtype``."""
  return LayerNorm(eps, dtype, name=name)


def drop_path(rate: float) -> nn.Dropout:
  """Stochastic depth: one Bernoulli draw per example, broadcast over tokens and channels."""
  return nn.Dropout(rate, broadcast_dims=(1, 2))


def drop_path_masks(
  module: nn.Module, rates: Sequence[float], batch: int, train: bool
) -> Array | None:
  """Stochastic depth's keep masks of every block at once: ``(len(rates), 2, batch)`` booleans,
  ``keep[i, j, b]`` True with probability ``1 - rates[i]``, for the two residual branches ``j``
  of block ``i`` and example ``b``; None when nothing is dropped (eval, or every rate 0).

  One draw from ``module.make_rng('dropout')`` in place of a ``drop_path`` per branch, each of
  which derives its own key (a ``fold_in``): on XLA:GPU each ``nn.Dropout`` costs three small
  kernels, this draw three for the whole model (docs/benchmarks.md, "A block's small kernels").
  """
  if not train or not any(rates):
    return None
  keep_prob = 1.0 - np.asarray(rates, np.float32)
  shape = (len(rates), 2, batch)
  return jax.random.bernoulli(module.make_rng("dropout"), keep_prob[:, None, None], shape)


def drop_examples(y: Array, keep: Array, rate: float) -> Array:
  """``drop_path(rate)`` with a given keep mask ``keep`` ``(B,)``: the examples it keeps scaled
  by ``1 / (1 - rate)``, the others zero (``nn.Dropout``'s arithmetic)."""
  if rate == 0.0:
    return y
  if rate == 1.0:
    return jnp.zeros_like(y)
  mask = jnp.broadcast_to(keep.reshape(-1, *(1,) * (y.ndim - 1)), y.shape)
  return jax.lax.select(mask, y / (1.0 - rate), jnp.zeros_like(y))


class AttentionSettings(nn.Module):
  """Keyword-only fields of a backbone's wrapper of the shared attention layer (Swin's windows):
  the attention kind's mask options, dropouts, dtypes and the kernel setting
  (``locvit.platform.ops``).

  Attributes:
    attention: a registered attention kind (``locvit.attention.list_attention``).
    attention_kwargs: that kind's options (e.g. ``{'num_kernels': 5}`` for 'gmm').
    attn_drop, proj_drop: dropout on the attention probabilities and after the projection.
    dtype, param_dtype: computation and parameter dtypes.
    implementation: the model's kernel setting (``locvit.platform.ops``).
  """

  _: dataclasses.KW_ONLY
  attention: str = "mhsa"
  attention_kwargs: Mapping[str, Any] | None = None
  attn_drop: float = 0.0
  proj_drop: float = 0.0
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  def layer_fields(self) -> dict[str, Any]:
    """These settings as fields of ``locvit.attention.Attention``."""
    names = ("attn_drop", "proj_drop", "dtype", "param_dtype", "implementation")
    return {name: getattr(self, name) for name in names}


class BlockSettings(nn.Module):
  """Keyword-only fields shared by the pre-norm blocks (``Block``, Swin's, CaiT's, T2T's).

  Attributes:
    attention: name of a registered attention kind (see ``locvit.attention.list_attention``).
    attention_kwargs: extra constructor arguments for that kind.
    drop, attn_drop, drop_path: dropout after projections, on attention probabilities, and
      stochastic depth.
    norm_eps: LayerNorm epsilon.
    dtype, param_dtype: computation and parameter dtypes.
    implementation: the model's kernel setting (``locvit.platform.ops``).
  """

  _: dataclasses.KW_ONLY
  attention: str = "mhsa"
  attention_kwargs: Mapping[str, Any] | None = None
  drop: float = 0.0
  attn_drop: float = 0.0
  drop_path: float = 0.0
  norm_eps: float = 1e-6
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  def attention_fields(self) -> dict[str, Any]:
    """Keyword arguments of the block's attention layer ``attn``: dropouts, dtypes, kernels."""
    return dict(
      attn_drop=self.attn_drop,
      proj_drop=self.drop,
      implementation=self.implementation,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="attn",
    )

  def registered_attention(self, **fields: Any) -> nn.Module:
    """The registered attention kind ``attention`` with ``fields``, the block's settings and
    ``attention_kwargs``."""
    kwargs = dict(self.attention_kwargs or {})
    return get_attention(self.attention)(**fields, **self.attention_fields(), **kwargs)


def block_settings(backbone: nn.Module, attention: str | None = None) -> dict[str, Any]:
  """``BlockSettings`` fields from a backbone's fields: ``attention`` (default the backbone's)
  with its ``attention_kwargs`` entry, ``drop_rate``, ``norm_eps``, dtypes and kernel setting."""
  kind = attention or backbone.attention
  return dict(
    attention=kind,
    attention_kwargs=(backbone.attention_kwargs or {}).get(kind),
    drop=backbone.drop_rate,
    norm_eps=backbone.norm_eps,
    dtype=backbone.dtype,
    param_dtype=backbone.param_dtype,
    implementation=backbone.attention_implementation,
  )


class Block(BlockSettings):
  """Pre-norm transformer block: ``x + drop_path(attn(LN(x)))``, ``x + drop_path(mlp(LN(x)))``.

  Attributes (besides ``BlockSettings``'):
    num_heads, head_dim, qkv_bias: the attention layer's (``head_dim`` None: ``C // num_heads``).
    mlp_ratio: the MLP's hidden width over the token width.

  Called as ``block(x, grid, num_prefix_tokens=0, train=False)`` on ``(B, N, C)`` tokens.
  """

  num_heads: int
  mlp_ratio: float = 4.0
  head_dim: int | None = None
  qkv_bias: bool = True

  @nn.compact
  def __call__(
    self,
    x: Array,
    grid: TokenGrid,
    num_prefix_tokens: int = 0,
    train: bool = False,
    keep: Array | None = None,
  ) -> Array:
    """``keep``: the two branches' stochastic-depth masks ``(2, B)`` (``drop_path_masks``); None
    draws them here, one ``drop_path`` per branch."""
    attn = self.registered_attention(
      num_heads=self.num_heads, head_dim=self.head_dim, qkv_bias=self.qkv_bias
    )
    branch = lambda y, **scale: attn(
      y, grid=grid, num_prefix_tokens=num_prefix_tokens, train=train, **scale
    )
    first, second = (None, None) if keep is None else keep
    drops = dict(rate=self.drop_path, train=train)
    x = pre_norm_residual(self, x, "norm1", branch, keep=first, scalable=True, **drops)
    x = mlp_residual(self, x, int(x.shape[-1] * self.mlp_ratio), keep=second, **drops)
    return nn.with_logical_constraint(x, ("batch", "seq", "embed"))


# ---------------------------------------------------------------------------------------------
# Backbone pieces shared by ViT, Swin, CaiT, PiT and T2T. Each is called inside the backbone's
# compact method and reads the backbone's fields (``patch_size``, ``embed_dim``, ``dtype``,
# ``param_dtype``, ``attention_implementation``, ``num_classes``), so parameters keep their paths.


def embed_patches(backbone: nn.Module, images: Array) -> tuple[Array, TokenGrid]:
  """``patch_embed``: the backbone's non-overlapping patch embedding of NHWC ``images``."""
  return PatchEmbed(
    backbone.patch_size,
    backbone.embed_dim,
    backbone.dtype,
    backbone.param_dtype,
    backbone.attention_implementation,
    name="patch_embed",
  )(images.astype(backbone.dtype))


def learned_position_embedding(backbone: nn.Module, x: Array) -> Array:
  """``x + pos_embed``: a learned ``(1, N, C)`` table (trunc-normal 0.02) over all of ``x``."""
  pos = backbone.param(
    "pos_embed",
    partitioned(trunc_normal, (None, None, "embed")),
    (1, *x.shape[1:]),
    backbone.param_dtype,
  )
  return x + pos.astype(x.dtype)


def class_token(backbone: nn.Module, batch: int, name: str = "cls_token") -> Array:
  """A learned ``(batch, 1, embed_dim)`` token (trunc-normal 0.02), e.g. the class token."""
  dim = backbone.embed_dim
  token = backbone.param(name, partitioned(trunc_normal, (None, None, "embed")), (1, 1, dim))
  return jnp.broadcast_to(token.astype(backbone.dtype), (batch, 1, dim))


def classify(backbone: nn.Module, features: Array, **inits: Callable) -> Array:
  """Sows ``pre_logits`` and applies the ``head`` (``classifier_head``, ``inits`` its kernel and
  bias initializers); returns the features when ``num_classes`` is 0."""
  backbone.sow("intermediates", "pre_logits", features)
  if not backbone.num_classes:
    return features
  head = classifier_head(backbone.num_classes, backbone.dtype, backbone.param_dtype, **inits)
  return head(features).astype(jnp.float32)


def pre_norm_residual(
  block: nn.Module,
  x: Array,
  norm: str,
  branch: Callable[[Array], Array],
  *,
  rate: float,
  train: bool,
  keep: Array | None = None,
  scalable: bool = False,
) -> Array:
  """The pre-norm residual ``x + drop_path(branch(LN(x)))`` with the LayerNorm named ``norm``
  (``block.norm_eps``, ``block.dtype``) and stochastic depth at ``rate``: with the keep mask
  ``keep`` ``(B,)`` when given (``drop_path_masks``), else drawn by a ``drop_path``.

  ``scalable``: ``branch`` also takes ``row_scale``, ``(B, 1, 1)`` factors of its output that its
  last projection applies inside its matmul (``ops.affine``). In a training step compiled for
  XLA:GPU (``ops.bias_in_matmul``) a given ``keep`` is applied so, ``drop_examples``'
  arithmetic to float rounding: the residual's gradient then reaches that matmul as it is, where
  the select is a kernel of its own in the backward pass (docs/benchmarks.md, "The backward
  pass's kernels")."""
  y = layer_norm(block.norm_eps, block.dtype, norm)(x)
  folds = scalable and keep is not None and train and 0.0 < rate < 1.0
  if folds and bias_in_matmul():
    return x + branch(y, row_scale=jnp.where(keep, 1.0 / (1.0 - rate), 0.0).reshape(-1, 1, 1))
  y = branch(y)
  if keep is not None and train:
    return x + drop_examples(y, keep, rate)
  return x + drop_path(rate)(y, deterministic=not train)


def mlp_residual(
  block: nn.Module,
  x: Array,
  hidden_dim: int,
  *,
  rate: float,
  train: bool,
  keep: Array | None = None,
) -> Array:
  """``x + drop_path(mlp(norm2(x)))``: the second half of every pre-norm block (``keep`` as in
  ``pre_norm_residual``)."""
  mlp = Mlp(
    hidden_dim, block.drop, block.dtype, block.param_dtype, block.implementation, name="mlp"
  )
  residual = dict(rate=rate, train=train, keep=keep)
  branch = lambda y, **scale: mlp(y, train, **scale)
  return pre_norm_residual(block, x, "norm2", branch, scalable=True, **residual)
