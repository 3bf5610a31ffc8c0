"""A locality prior added to a pretrained plain ViT/DeiT: the source's parameters in a GMM- or
ELM-masked ViT, or in a ConViT (GPSA/PSA layers), set so that the new model starts from the
source's function where the math allows.

``add_locality_prior(source, target, model, image_size=...)`` is a pure function on variable
trees: ``source`` holds the pretrained ``VisionTransformer``'s parameters (all attention 'mhsa',
already at the target's class count and grid, e.g. from ``locvit.convert``), ``target`` a fresh
``model.init`` of the new model. Every parameter the two models share is copied; only the prior's
parameters keep (or take) the values below. Per attention kind of a target layer:

- ``'elm'`` (Li & Zhang Sec. 3.1): the mask ``elm`` is all ones with ``combine='multiply'``
  (``logits * 1``) and all zeros with ``'add'``. **Exact.**
- ``'gmm'`` (Li & Zhang Eq. 1, 9), ``combine='add'``: every ``alpha`` 0, so the table is 0;
  ``sigma`` keeps its fresh init (it learns once ``alpha`` moves). **Exact.**
- ``'gmm'``, ``combine='multiply'``: kernel 0 is flat, ``alpha_0 = 1`` and ``sigma_0 = 1e15``
  (``exp(-d^2 / (2 sigma^2))`` rounds to 1 in float32 for any grid), the other kernels ``alpha =
  0`` with ``sigma`` fresh: the table is 1. **Exact** with ``kernel='intended'``, and with
  ``'faithful'`` on grids up to 8x8. On a 'faithful' grid of 9x9 or more the official base
  ``exp(-d^2) ** 0.5`` is exactly 0 in float32 for ``d^2 >= 104`` whatever sigma is, so those
  logits become 0 (14x14 at 224 px: 8,580 of 38,416 query-key pairs): **approximate**, and the
  report says how many pairs.
- ``'gpsa'`` (ConViT Eqs. 6-7): ``qk`` and ``v`` are the source's fused ``qkv`` split (its first
  two thirds and its last third), ``pos_proj`` keeps its fresh (local, Eq. 5) init and every
  ``gating_param`` is ``gate_logit``: the attention is ``(1 - g) softmax(QK^T) + g P`` with
  ``g = sigmoid(gate_logit)``. ``g`` is 0 in float32 only for ``gate_logit <= -88``
  (``sigmoid(-88)`` underflows, and on CPU XLA flushes the subnormal ``sigmoid(-87) = 1.6e-38``
  to 0), where its gradient ``g (1 - g)`` is 0 as well: the gate and ``pos_proj`` would never
  learn. The default ``gate_logit = -10`` keeps the prior trainable: ``g = 4.54e-5``, so each
  attention row moves by at most ``2 g = 9.1e-5`` in L1 norm from the source's (a bounded,
  approximate start); ``gate_logit=CLOSED_GATE`` (-104, 0 on any float32 hardware) gives the exact
  but inert gate.
- ``'psa'`` (ConViT Eq. 4): ``pos_proj`` is zero, so the positional logits are 0. Exact (up to
  the class token, below).
- ``'mhsa'``: the source's layer, unchanged.

GPSA and PSA are defined on patch tokens only, so a ConViT inserts its class token after them
(``class_token_layer = L``) while DeiT's joins at the input. The class (and distillation) token
then starts as the source's token plus its ``pos_embed`` row, and the patch tokens take the rest of
``pos_embed``; but the source's patch tokens attend to the class token in layers ``0..L-1`` and
the ConViT's cannot: a ConViT from a class-token DeiT is **approximate** whatever the gate. From a
source without a class token (``pool='gap'``) it is exact with ``gate_logit=CLOSED_GATE``.

"Exact" means the same arithmetic up to the attention kernels' rounding: the masked and gated
layers run other kernels than plain attention (tests/test_prior.py: logits to 1e-5).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention import TokenGrid
from locvit.attention.masks import GMMAttention, gaussian_mixture
from locvit.configs.defaults import PRIOR_GATE_LOGIT as DEFAULT_GATE_LOGIT
from locvit.models.vit import VisionTransformer

CLOSED_GATE = -104.0  # sigmoid(-104) = 0 in float32 whether or not subnormals are kept
FLAT_SIGMA = 1e15  # exp(-d^2 / (2 sigma^2)) == 1.0 in float32 for every d^2 below 1e22
PRIOR_KINDS = ("mhsa", "gmm", "elm", "gpsa", "psa")
PREFIX_TOKENS = ("cls_token", "dist_token")  # in the order VisionTransformer inserts them
# The model fields that make a plain ViT/DeiT a model with a prior (the rest are the source's).
PRIOR_FIELDS = ("layer_attention", "attention_kwargs", "class_token_layer")
_BLOCK = re.compile(r"blocks_(\d+)/attn/(.+)")


class PriorError(ValueError):
  """Source and target that no prior surgery joins; the message lists every problem."""


@dataclasses.dataclass(frozen=True)
class PriorReport:
  """What ``add_locality_prior`` did.

  Attributes:
    layers: ``{'blocks_3': 'gpsa', ...}``: the target's attention kind per block.
    fresh: the prior's parameter paths, at their function-preserving or fresh values.
    approximations: why the new model's function differs from the source's (empty: exact).
  """

  layers: dict[str, str]
  fresh: tuple[str, ...]
  approximations: tuple[str, ...]

  @property
  def exact(self) -> bool:
    """Whether the new model computes the source's function (up to the kernels' rounding)."""
    return not self.approximations

  def summary(self) -> str:
    """One line: the prior added, per kind, and whether the start is exact (and if not, why)."""
    counts: dict[str, int] = {}
    for kind in self.layers.values():
      counts[kind] = counts.get(kind, 0) + 1
    kinds = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    how = "exact start" if self.exact else "approximate start: " + "; ".join(self.approximations)
    return (
      f"locality prior added to the pretrained weights: {kinds} layers, {len(self.fresh)} prior "
      f"parameters new, the rest copied; {how}"
    )


def _kind_options(model: VisionTransformer, kind: str) -> dict[str, Any]:
  """``attention_kwargs[kind]`` over the layer class's defaults (combine, kernel)."""
  options = {"combine": "multiply", "kernel": GMMAttention.kernel}
  options.update((model.attention_kwargs or {}).get(kind) or {})
  return options


def _prior_values(
  kind: str,
  name: str,
  fresh: np.ndarray,
  options: Mapping[str, Any],
  gate_logit: float,
) -> np.ndarray:
  """The function-preserving value of prior parameter ``name`` (path inside ``attn``)."""
  multiply = options["combine"] == "multiply"
  if kind == "elm":
    return np.full_like(fresh, 1.0 if multiply else 0.0)
  if kind == "gmm" and name == "mask/alpha":
    alpha = np.zeros_like(fresh)
    if multiply:
      alpha[0] = 1.0
    return alpha
  if kind == "gmm" and name == "mask/sigma":
    sigma = np.array(fresh)
    if multiply:
      sigma[0] = FLAT_SIGMA
    return sigma
  if kind == "gpsa" and name == "gating_param":
    return np.full_like(fresh, gate_logit)
  if kind == "psa" and name.startswith("pos_proj/"):
    return np.zeros_like(fresh)
  return np.asarray(fresh)  # gpsa's pos_proj: the fresh local init (Eq. 5)


def _is_prior(kind: str, name: str) -> bool:
  if kind in ("gmm", "elm"):
    return name.startswith("mask/")
  if kind in ("gpsa", "psa"):
    return name.startswith("pos_proj/") or name == "gating_param"
  return False


def _gmm_zero_pairs(alpha, sigma, grid: TokenGrid, kernel: str) -> int:
  """Query-key pairs where the multiply table is not 1 (0 means the start is exact)."""
  table = np.asarray(gaussian_mixture(jnp.asarray(alpha), jnp.asarray(sigma), grid, kernel))
  return int(np.sum(table[0] != 1.0))


def _unsupported_kinds(kinds: tuple[str, ...]) -> list[str]:
  """A problem line per block whose attention kind has no function-preserving prior."""
  return [
    f"  blocks_{i}: attention kind {kind!r} has no function-preserving prior (supported: "
    f"{', '.join(PRIOR_KINDS)})"
    for i, kind in enumerate(kinds)
    if kind not in PRIOR_KINDS
  ]


def _unused_problems(src: Mapping[str, Any], used: set[str]) -> list[str]:
  """A problem line per source parameter the target has no place for."""
  unused = sorted(set(src) - used)
  problems = [f"  {key}: in the source, no place in the model" for key in unused]
  if any(key.endswith("qkv/bias") for key in unused):
    problems.append("  (the source has qkv biases: build the model with qkv_bias=True)")
  return problems


@dataclasses.dataclass
class _Transfer:
  """The target's flat parameters filled from the flat source ``src`` (``out``), the source keys
  read (``used``) and the problems found; ``prefix``: the source's prefix tokens, joining late
  (``late_prefix``: ``class_token_layer > 0``) where the target pools on the class token."""

  src: Mapping[str, Any]
  dst: Mapping[str, Any]
  prefix: list[str]
  late_prefix: bool
  out: dict[str, Any] = dataclasses.field(default_factory=dict)
  used: set[str] = dataclasses.field(default_factory=set)
  problems: list[str] = dataclasses.field(default_factory=list)

  def take(self, key: str, value: Any, what: str) -> None:
    """``out[key] = value`` in the target's dtype, or the problem: missing or mis-shaped."""
    want = tuple(np.shape(self.dst[key]))
    if value is None:
      self.problems.append(f"  {key}: not in the source ({what})")
    elif tuple(np.shape(value)) != want:
      self.problems.append(f"  {key}: source {what} has shape {np.shape(value)}, the model {want}")
    else:
      self.out[key] = np.asarray(value, np.asarray(self.dst[key]).dtype)

  def fill(self, model: VisionTransformer, layers: dict[str, str], gate_logit: float) -> list[str]:
    """Every target parameter set (the prior's) or taken from the source; the prior's keys."""
    fresh = []
    for key, fresh_value in self.dst.items():
      block = _BLOCK.fullmatch(key)
      kind = layers.get(f"blocks_{block.group(1)}") if block else None
      if block and _is_prior(kind, block.group(2)):
        options = _kind_options(model, kind)
        value = _prior_values(kind, block.group(2), np.asarray(fresh_value), options, gate_logit)
        self.out[key] = value
        fresh.append(key)
      elif block and kind in ("gpsa", "psa") and block.group(2).split("/")[0] in ("qk", "v"):
        self.take_split_qkv(key, block.group(1), *block.group(2).split("/"))
      elif key == "pos_embed" and self.late_prefix and key in self.src:
        self.used.add(key)
        value = np.asarray(self.src[key])
        want = np.shape(fresh_value)
        self.take(key, value[:, len(self.prefix) :] if np.shape(value) != want else value, key)
      elif key in PREFIX_TOKENS and self.late_prefix and key in self.src:
        self.used.add(key)
        row = PREFIX_TOKENS.index(key)
        position = np.asarray(self.src["pos_embed"])[:, row : row + 1]
        self.take(key, np.asarray(self.src[key]) + position, key)
      else:
        self.used.add(key)
        self.take(key, self.src.get(key), "parameter")
    return fresh

  def take_split_qkv(self, key: str, block: str, part: str, leaf: str) -> None:
    """GPSA/PSA's ``qk`` or ``v`` ``leaf`` (kernel, bias): its rows of the source's fused qkv."""
    qkv_key = f"blocks_{block}/attn/qkv/{leaf}"
    qkv = self.src.get(qkv_key)
    self.used.add(qkv_key)
    axis = 1 if leaf == "kernel" else 0
    if qkv is not None and np.shape(qkv)[axis] == 3:
      qkv = np.take(np.asarray(qkv), [0, 1] if part == "qk" else 2, axis=axis)
    self.take(key, qkv, f"qkv {leaf} ({part} split from it)")


def _late_prefix_notes(model: VisionTransformer, late_prefix: bool) -> list[str]:
  """Why the start is approximate where the source's class token joins later in the target."""
  if not late_prefix:
    return []
  return [
    f"the class token joins at block {model.class_token_layer} (the source's at the input), so "
    f"in blocks 0-{model.class_token_layer - 1} the patch tokens no longer attend to it"
  ]


def _gpsa_gate_notes(layers: dict[str, str], gate_logit: float) -> list[str]:
  """Why the start is approximate where GPSA gates are not closed (Eq. 6's sigmoid above 0)."""
  gate = float(jax.nn.sigmoid(jnp.float32(gate_logit)))
  if "gpsa" not in layers.values() or gate == 0.0:
    return []
  return [
    f"GPSA gates at sigmoid({gate_logit:g}) = {gate:.3g} on position (each attention row "
    f"within {2 * gate:.2g} in L1 of the source's)"
  ]


def _gmm_underflow_notes(
  model: VisionTransformer, layers: dict[str, str], out: Mapping[str, Any], side: int
) -> list[str]:
  """Why the start is approximate where a multiplied GMM table underflows (the first such)."""
  grid = TokenGrid(side, side)
  for name, kind in layers.items():
    options = _kind_options(model, kind)
    if kind == "gmm" and options["combine"] == "multiply":
      alpha, sigma = out[f"{name}/attn/mask/alpha"], out[f"{name}/attn/mask/sigma"]
      zeros = _gmm_zero_pairs(alpha, sigma, grid, options["kernel"])
      if zeros:
        return [
          f"GMM 'faithful' tables underflow to 0 on {zeros} of {grid.num_tokens**2} query-key "
          f"pairs of the {side}x{side} grid, whose logits become 0 (kernel='intended' starts "
          "exactly)"
        ]
  return []


def add_locality_prior(
  source: Mapping[str, Any],
  target: Mapping[str, Any],
  model: VisionTransformer,
  *,
  image_size: int,
  gate_logit: float = DEFAULT_GATE_LOGIT,
) -> tuple[dict[str, Any], PriorReport]:
  """The source's parameters in ``model``, the prior's set as the module docstring says.

  Args:
    source: ``{'params': ...}`` of a plain ViT/DeiT (every layer 'mhsa') at ``model``'s class
      count and grid.
    target: ``{'params': ...}``, a fresh ``model.init``; its prior parameters are kept or set.
    model: the target ``VisionTransformer`` (its ``layer_attention``, ``attention_kwargs`` and
      ``class_token_layer`` say what to set).
    image_size: the input side, for the token grid (GMM's exactness depends on it).
    gate_logit: the initial ``gating_param`` of GPSA layers (module docstring).

  Returns:
    ``({'params': ...}, PriorReport)``.

  Raises:
    PriorError: listing every parameter that neither model's layout explains (a missing or
      mis-shaped parameter, a source parameter the target has no place for, an attention kind
      with no function-preserving prior).
  """
  src = flax.traverse_util.flatten_dict(_params(source), sep="/")
  dst = flax.traverse_util.flatten_dict(_params(target), sep="/")
  kinds = tuple(model.layer_attention or ("mhsa",) * model.depth)
  layers = {f"blocks_{i}": kind for i, kind in enumerate(kinds)}
  late_prefix = model.pool == "token" and model.class_token_layer > 0
  transfer = _Transfer(src, dst, [name for name in PREFIX_TOKENS if name in src], late_prefix)
  fresh = transfer.fill(model, layers, gate_logit)
  problems = _unsupported_kinds(kinds) + transfer.problems + _unused_problems(src, transfer.used)
  if problems:
    raise PriorError(
      "The pretrained parameters do not fit the model with a locality prior:\n"
      + "\n".join(problems)
    )
  side = image_size // model.patch_size
  approximations = [
    *_late_prefix_notes(model, late_prefix and bool(transfer.prefix)),
    *_gpsa_gate_notes(layers, gate_logit),
    *_gmm_underflow_notes(model, layers, transfer.out, side),
  ]
  params = flax.traverse_util.unflatten_dict(
    {key: jnp.asarray(value) for key, value in transfer.out.items()}, sep="/"
  )
  return {"params": params}, PriorReport(layers, tuple(fresh), tuple(approximations))


def source_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
  """The ``create_model`` overrides of the plain source model: ``overrides`` of the model with a
  prior without ``PRIOR_FIELDS``."""
  return {k: v for k, v in overrides.items() if k not in PRIOR_FIELDS}


def prior_from_pretrained(
  source: Mapping[str, Any],
  model: VisionTransformer,
  *,
  image_size: int,
  seed: int,
  gate_logit: float = DEFAULT_GATE_LOGIT,
) -> tuple[dict[str, Any], PriorReport]:
  """``add_locality_prior`` onto a fresh ``model.init`` (key ``seed``) at ``image_size``."""
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  target = jax.jit(model.init)(jax.random.key(seed), images)
  variables, report = add_locality_prior(
    source, target, model, image_size=image_size, gate_logit=gate_logit
  )
  return jax.device_get(variables), report


def _params(variables: Mapping[str, Any]) -> Mapping[str, Any]:
  tree = flax.core.unfreeze(flax.linen.meta.unbox(variables))
  return tree.get("params", tree)
