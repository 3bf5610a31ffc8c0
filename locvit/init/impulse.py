"""The impulse-initialization solver (Zheng, Li, Lucey: Algorithm 1, Eq. 8), backbone-agnostic.

For each solve, per head ``h``, it finds ``Q[h]: (D, hd)`` and ``K[h]: (hd, D)`` such that

    softmax(X Q[h] K[h] X^T * hd^-0.5)  ~  H_impulse[h]                        (Eq. 7)

by minimising ``mean_{h,i,j} (softmax(...) - H)^2`` (Eq. 8, the reference's ``nn.MSELoss``) with
Adam (lr 1e-4, torch's betas and eps) for 10,000 steps. ``X`` is a pseudo input
(``pseudo_inputs.py``), ``H`` a random impulse matrix per head (``targets.py``), and
``Q, K ~ sqrt(1/(hd*h)) * U(-1, 1)``. As in the reference, every ``norm_every`` steps
(step 0 included, before the update) each column of ``Q[h]`` (a vector over D) and each
``K[h][:, d]`` (a vector over hd) is rescaled to ``nq``, the mean initial column norm of ``Q``.

Modes (Sec. 5.4): 'same' shares one solve by all layers (two solves when the first layer has its
own pseudo input); 'different' solves every layer separately. All solves and heads run in ONE
compiled call: the step loop is a ``lax.scan``, heads are batched, and solves are ``vmap``-ed
(accelerators) or ``lax.map``-ed (CPU, where one solve at a time stays in cache).

Speed: ``X = LayerNorm(PE)`` has low rank (the sin-cos embedding is a sum of a function of the row
and one of the column: rank 31 = 2 * 16 - 1 on a 16x16 grid, 25 above float32 round-off, of
D = 192), so with ``X = U (S V^T)`` the logits are computed as
``U (S V^T Q)(S V^T K^T)^T U^T`` through an ``r x r`` core. Adam still updates ``Q`` and ``K``
themselves, so the optimisation is the reference's; only singular values below
``rank_tol * s_max`` (float32 round-off) are dropped. ``rank_tol=0`` uses the dense formula.

Solutions are deterministic given the seed and cached on disk as ``.npz`` keyed by a hash of the
solver config, the shapes and the seed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from locvit.attention import TokenGrid
from locvit.configs.defaults import IMPULSE_SOLVE
from locvit.init.pseudo_inputs import canonical_pseudo_input, pseudo_input
from locvit.init.rng import numpy_rng, single_threaded_blas
from locvit.init.targets import check_filter_size, draw_taps, impulse_key_indices, tap_to_offset

MODES = ("same", "different")
# Named Adam settings (``config.init.solver``). 'paper': the paper's / reference's. 'fast': the same
# path length in 20x fewer steps, at the paper's quality (docs/benchmarks.md).
SOLVER_PRESETS = {
  "paper": dict(steps=10_000, lr=1e-4, norm_every=100),
  "fast": dict(steps=500, lr=2e-3, norm_every=5),
}
CACHE_VERSION = 1
# torch.optim.Adam defaults, which the reference uses.
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8


@dataclasses.dataclass(frozen=True)
class SolverConfig:
  """Settings of the impulse solve; the defaults are the paper's / reference code's (Zheng, Li,
  Lucey Sec. 4.2: Adam, lr 1e-4, 10,000 steps; Sec. 5.4 for the pseudo inputs and modes).

  Attributes:
    filter_size: odd impulse filter size f (Imp.-3, Imp.-5, ...).
    mode: 'same' (one solve shared by all layers) or 'different' (one solve per layer).
    pseudo_input: pseudo input of the following layers (of all layers unless
      ``pseudo_input_first`` is set); see ``pseudo_inputs.PSEUDO_INPUTS``.
    pseudo_input_first: pseudo input of the first layer (Tables 4 and 7), None = the same.
    steps, lr: Adam iterations and learning rate.
    norm_every: column renormalisation period in steps (0 disables it).
    cover_offsets: choose impulse positions covering all f^2 offsets (when heads >= f^2)
      instead of the reference's independent draws.
    rank_tol: relative singular-value cut-off for the low-rank evaluation (0: dense).
  """

  filter_size: int = IMPULSE_SOLVE["filter_size"]
  mode: str = IMPULSE_SOLVE["mode"]
  pseudo_input: str = IMPULSE_SOLVE["pseudo_input"]
  pseudo_input_first: str | None = IMPULSE_SOLVE["pseudo_input_first"]
  steps: int = 10_000
  lr: float = 1e-4
  norm_every: int = 100
  cover_offsets: bool = IMPULSE_SOLVE["cover_offsets"]
  rank_tol: float = IMPULSE_SOLVE["rank_tol"]

  def validate(self, grid: TokenGrid) -> None:
    """Raises ValueError naming the bad field (filter size for ``grid``, mode, pseudo inputs,
    steps / norm_every / lr, rank_tol) before anything is compiled."""
    check_filter_size(self.filter_size, grid)
    if self.mode not in MODES:
      raise ValueError(f"mode={self.mode!r} is not one of {MODES}.")
    canonical_pseudo_input(self.pseudo_input)
    if self.pseudo_input_first is not None:
      canonical_pseudo_input(self.pseudo_input_first)
    if self.steps < 1 or self.norm_every < 0 or self.lr <= 0:
      raise ValueError(
        f"steps={self.steps} must be >= 1, norm_every={self.norm_every} >= 0 and lr={self.lr} > 0."
      )
    if not 0.0 <= self.rank_tol < 1.0:
      raise ValueError(f"rank_tol={self.rank_tol} must be in [0, 1).")

  def plan(self, depth: int) -> tuple[list[str], np.ndarray]:
    """Pseudo input of every solve, and the solve index each of ``depth`` layers uses."""
    rest = canonical_pseudo_input(self.pseudo_input)
    first = canonical_pseudo_input(self.pseudo_input_first or self.pseudo_input)
    if self.mode == "different":
      return [first] + [rest] * (depth - 1), np.arange(depth)
    if first == rest or depth == 1:
      return [first], np.zeros(depth, np.int64)
    # The reference solves the first layer, then once more for all following layers.
    return [first, rest], np.minimum(np.arange(depth), 1)


@dataclasses.dataclass
class ImpulseSolution:
  """Solved ``q: (S, H, D, hd)`` and ``k: (S, H, hd, D)`` for S solves, and their quality.

  ``layer_solve[l]`` is the solve used by layer ``l``. ``loss`` is Eq. 8 at the final parameters
  (dense ``X``); ``argmax_fraction[s, h]`` the fraction of rows with an in-grid target whose
  attention argmax is the target key.
  """

  q: np.ndarray
  k: np.ndarray
  taps: np.ndarray
  offsets: np.ndarray
  layer_solve: np.ndarray
  pseudo_inputs: list[str]
  loss: np.ndarray
  argmax_fraction: np.ndarray
  compile_seconds: float = 0.0
  solve_seconds: float = 0.0
  from_cache: bool = False

  def layer(self, index: int) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, K)`` of layer ``index``: ``(H, D, hd)`` and ``(H, hd, D)``."""
    s = self.layer_solve[index]
    return self.q[s], self.k[s]

  def report(self) -> str:
    """One line per solve: its layers, pseudo input, Eq. 8 loss, per-head argmax fraction and
    impulse offsets ``(m, n)``."""
    lines = []
    for s, kind in enumerate(self.pseudo_inputs):
      layers = np.flatnonzero(self.layer_solve == s).tolist()
      fractions = " ".join(f"{f:.3f}" for f in self.argmax_fraction[s])
      offsets = " ".join(f"({m:+d},{n:+d})" for m, n in self.offsets[s])
      lines.append(
        f"solve {s} (layers {layers}, input {kind}): loss {self.loss[s]:.3e}  "
        f"argmax fraction per head [{fractions}]  offsets {offsets}"
      )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Problem set-up (NumPy, once per solve)


def _factor(x: np.ndarray, rank_tol: float) -> tuple[np.ndarray, np.ndarray, int]:
  """``x = U @ SV`` with ``U: (N, r)`` orthonormal, dropping singular values < tol * s_max."""
  u, s, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
  rank = max(int(np.sum(s > rank_tol * s[0])), 1)
  return u[:, :rank], s[:rank, None] * vt[:rank], rank


def _setup(cfg: SolverConfig, kinds, grid, dim, heads, head_dim, seed):
  """Targets, pseudo inputs and initial Q, K for every solve (deterministic in ``seed``)."""
  taps, xs, q0, k0 = [], [], [], []
  bound = np.sqrt(1.0 / (head_dim * heads))
  for s, kind in enumerate(kinds):
    rng = lambda part, s=s: numpy_rng(seed, "impulse", s, part)
    taps.append(draw_taps(rng("taps"), heads, cfg.filter_size, cfg.cover_offsets))
    xs.append(pseudo_input(kind, grid, dim, rng("input")))
    q0.append(bound * rng("q").uniform(-1.0, 1.0, (heads, dim, head_dim)))
    k0.append(bound * rng("k").uniform(-1.0, 1.0, (heads, head_dim, dim)))
  taps = np.stack(taps)
  offsets = tap_to_offset(taps, cfg.filter_size)
  targets = impulse_key_indices(grid, offsets)  # (S, H, N)
  f32 = lambda a: np.stack(a).astype(np.float32)
  return taps, offsets, targets, f32(xs), f32(q0), f32(k0)


def _features(xs: np.ndarray, head_dim: int, rank_tol: float):
  """Per-solve ``(U, SV)`` zero-padded to a common rank, or None when dense is cheaper."""
  if rank_tol <= 0:
    return None
  with single_threaded_blas():
    factors = [_factor(x, rank_tol) for x in xs]
  rank = max(r for _, _, r in factors)
  if rank >= head_dim:  # the r x r core is no cheaper than the hd-wide logits product
    return None
  n, d = xs.shape[1:]
  u = np.zeros((len(xs), n, rank), np.float32)
  sv = np.zeros((len(xs), rank, d), np.float32)
  for s, (fu, fsv, r) in enumerate(factors):
    u[s, :, :r], sv[s, :r] = fu, fsv
  return u, sv


# ------------------------------------------------------------------------------------------------
# The compiled solve


def attention_logits_dense(q, k, x, scale):
  """``X Q[h] K[h] X^T * scale`` for all heads: ``(H, N, N)`` (the softmax argument of Zheng, Li,
  Lucey Eq. 8, with ``scale = sigma = hd^-0.5``)."""
  a = jnp.einsum("nd,hde->hne", x, q)
  b = jnp.einsum("nd,hed->hne", x, k)
  return jnp.einsum("hne,hme->hnm", a, b) * scale


def _logits_lowrank(q, k, u, sv, scale):
  cq = jnp.einsum("rd,hde->hre", sv, q)
  ck = jnp.einsum("rd,hed->hre", sv, k)
  core = jnp.einsum("hre,hse->hrs", cq, ck) * scale
  return jnp.einsum("hns,ms->hnm", jnp.einsum("nr,hrs->hns", u, core), u)


def _one_hot(target: jax.Array, num_tokens: int) -> jax.Array:
  return (jnp.arange(num_tokens) == target[..., None]).astype(jnp.float32)


def _loss(params, feats, target, scale):
  q, k = params
  if len(feats) == 2:
    logits = _logits_lowrank(q, k, *feats, scale)
  else:
    logits = attention_logits_dense(q, k, feats[0], scale)
  probs = jax.nn.softmax(logits, axis=-1)
  return jnp.mean(jnp.square(probs - _one_hot(target, logits.shape[-1])))


def _renormalise(params, nq):
  """Q's columns (over D) and K's vectors over hd rescaled to norm ``nq`` (reference code)."""
  q, k = params
  q = q / (jnp.linalg.norm(q, axis=1, keepdims=True) / nq)
  k = k / (jnp.linalg.norm(k, axis=1, keepdims=True) / nq)
  return q, k


def _solve_one(q0, k0, feats, target, *, steps, lr, norm_every, scale):
  tx = optax.adam(lr, b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS)
  nq = jnp.mean(jnp.linalg.norm(q0, axis=1))
  grad_fn = jax.grad(_loss)

  def body(carry, step):
    params, opt_state = carry
    if norm_every:
      params = jax.lax.cond(
        step % norm_every == 0, lambda p: _renormalise(p, nq), lambda p: p, params
      )
    grads = grad_fn(params, feats, target, scale)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  params = (q0, k0)
  (params, _), _ = jax.lax.scan(body, (params, tx.init(params)), jnp.arange(steps))
  return params


@functools.partial(jax.jit, static_argnames=("steps", "lr", "norm_every", "scale", "batching"))
def _solve_all(q0, k0, feats, targets, *, steps, lr, norm_every, scale, batching):
  fn = functools.partial(_solve_one, steps=steps, lr=lr, norm_every=norm_every, scale=scale)
  if batching == "map":  # solves one after another: each one's working set stays in cache
    return jax.lax.map(lambda args: fn(*args), (q0, k0, feats, targets))
  return jax.vmap(fn)(q0, k0, feats, targets)


@functools.partial(jax.jit, static_argnames=("scale",))
def _quality(q, k, xs, targets, *, scale):
  """Per solve: Eq. 8 loss and per-head argmax fraction over rows with an in-grid target."""

  def one(q, k, x, target):
    probs = jax.nn.softmax(attention_logits_dense(q, k, x, scale), axis=-1)
    loss = jnp.mean(jnp.square(probs - _one_hot(target, probs.shape[-1])))
    valid = target >= 0
    hits = (jnp.argmax(probs, -1) == target) & valid
    return loss, hits.sum(-1) / jnp.maximum(valid.sum(-1), 1)

  return jax.vmap(one)(q, k, xs, targets)


# ------------------------------------------------------------------------------------------------
# Public entry points


def cache_key(cfg: SolverConfig, grid: TokenGrid, dim, heads, head_dim, depth, seed) -> str:
  """Hash of everything the solution depends on."""
  payload = dict(
    version=CACHE_VERSION,
    config=dataclasses.asdict(cfg),
    grid=[grid.height, grid.width],
    shape=[int(dim), int(heads), int(head_dim), int(depth)],
    seed=int(seed),
  )
  return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _load(path: str) -> ImpulseSolution:
  with np.load(path) as data:
    fields = {name: data[name] for name in data.files}
  fields["pseudo_inputs"] = [str(s) for s in fields["pseudo_inputs"]]
  for name in ("compile_seconds", "solve_seconds"):
    fields[name] = float(fields[name])
  return ImpulseSolution(**fields, from_cache=True)


def _save(path: str, solution: ImpulseSolution) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fields = dataclasses.asdict(solution)
  fields.pop("from_cache")
  fields["pseudo_inputs"] = np.asarray(solution.pseudo_inputs)
  tmp = f"{path}.{os.getpid()}.tmp.npz"
  np.savez(tmp, **fields)
  os.replace(tmp, path)  # atomic: concurrent processes never read a partial file


def optimize_qk(
  q0: np.ndarray,
  k0: np.ndarray,
  xs: np.ndarray,
  targets: np.ndarray,
  *,
  steps: int,
  lr: float,
  norm_every: int,
  rank_tol: float = 1e-7,
  batching: str | None = None,
) -> tuple[np.ndarray, np.ndarray, float, float]:
  """Runs the loop of Zheng, Li, Lucey's Algorithm 1 (minimising Eq. 8) for S solves from given
  starting points, in one compiled call.

  Args:
    q0, k0: ``(S, H, D, hd)`` and ``(S, H, hd, D)`` initial parameters.
    xs: ``(S, N, D)`` pseudo inputs (already layer-normalised).
    targets: ``(S, H, N)`` target key per query, -1 for an all-zero row.
    steps, lr, norm_every, rank_tol: as in ``SolverConfig``.
    batching: 'vmap' (all solves at once, the default) or 'map' (``lax.map``: one solve after the
      other inside the same compiled call; 20-30% faster on CPU, where each solve's working set
      stays in cache). The caller chooses from its resolved kernel setting; heads are always
      batched.

  Returns ``(q, k, compile_seconds, run_seconds)``.
  """
  batching = batching or "vmap"
  if batching not in ("map", "vmap"):
    raise ValueError(f"batching={batching!r} is not one of ('map', 'vmap').")
  head_dim = q0.shape[-1]
  factors = _features(np.asarray(xs), head_dim, rank_tol)
  feats = factors if factors is not None else (np.asarray(xs, np.float32),)
  static = dict(steps=steps, lr=lr, norm_every=norm_every, scale=head_dim**-0.5, batching=batching)
  args = (np.asarray(q0, np.float32), np.asarray(k0, np.float32), feats, np.asarray(targets))
  start = time.perf_counter()
  compiled = _solve_all.lower(*args, **static).compile()
  compiled_at = time.perf_counter()
  q, k = jax.block_until_ready(compiled(*args))
  return np.asarray(q), np.asarray(k), compiled_at - start, time.perf_counter() - compiled_at


def solve_impulse(
  cfg: SolverConfig,
  grid: TokenGrid,
  dim: int,
  num_heads: int,
  head_dim: int,
  depth: int = 1,
  *,
  seed: int = 0,
  cache_dir: str | None = None,
  batching: str | None = None,
) -> ImpulseSolution:
  """Solves Zheng, Li, Lucey's Eq. 8 (Algorithm 1) for every solve of ``cfg.plan(depth)`` in one
  compiled call; returns an ``ImpulseSolution`` (cached on disk under ``cache_dir``).

  Args:
    cfg: solver settings.
    grid: the token grid (N = height * width tokens).
    dim, num_heads, head_dim: D, h and hd of the attention layers.
    depth: number of layers (the number of solves in 'different' mode).
    seed: all randomness (impulse positions, random pseudo inputs, initial Q/K) derives from it.
    cache_dir: directory of cached solutions (None: no cache).
    batching: 'vmap' or 'map', as in ``optimize_qk``.
  """
  cfg.validate(grid)
  if depth < 1:
    raise ValueError(f"depth={depth} must be >= 1.")
  path = None
  if cache_dir:
    key = cache_key(cfg, grid, dim, num_heads, head_dim, depth, seed)
    path = os.path.join(os.path.expanduser(cache_dir), f"impulse-{key}.npz")
    if os.path.exists(path):
      return _load(path)

  kinds, layer_solve = cfg.plan(depth)
  taps, offsets, targets, xs, q0, k0 = _setup(cfg, kinds, grid, dim, num_heads, head_dim, seed)
  q, k, compile_seconds, solve_seconds = optimize_qk(
    q0, k0, xs, targets, steps=cfg.steps, lr=cfg.lr, norm_every=cfg.norm_every,
    rank_tol=cfg.rank_tol, batching=batching,
  )  # fmt: skip
  loss, fraction = _quality(q, k, xs, targets, scale=head_dim**-0.5)
  solution = ImpulseSolution(
    q=q,
    k=k,
    taps=taps,
    offsets=offsets,
    layer_solve=np.asarray(layer_solve),
    pseudo_inputs=list(kinds),
    loss=np.asarray(loss),
    argmax_fraction=np.asarray(fraction),
    compile_seconds=compile_seconds,
    solve_seconds=solve_seconds,
  )
  if path:
    _save(path, solution)
  return solution


def solver_config(fields=None, **overrides) -> SolverConfig:
  """A ``SolverConfig`` from a mapping (e.g. ``config.init``), ignoring unrelated keys.

  ``fields['solver']`` (a key of ``SOLVER_PRESETS``, default 'paper') gives ``steps``, ``lr`` and
  ``norm_every``; any of them set (not None) in ``fields`` or ``overrides`` replaces the preset's.
  """
  fields = dict(fields) if fields is not None else {}
  fields.update(overrides)
  solver = fields.get("solver") or "paper"
  if solver not in SOLVER_PRESETS:
    raise ValueError(
      f"init.solver={solver!r} is not a solver preset. Valid choices: {list(SOLVER_PRESETS)}."
    )
  names = [f.name for f in dataclasses.fields(SolverConfig)]
  values = {name: fields[name] for name in names if fields.get(name) is not None}
  return SolverConfig(**{**SOLVER_PRESETS[solver], **values})


__all__: Sequence[str] = (
  "MODES",
  "SOLVER_PRESETS",
  "ImpulseSolution",
  "SolverConfig",
  "attention_logits_dense",
  "cache_key",
  "optimize_qk",
  "solve_impulse",
  "solver_config",
)
