"""Seeds side by side: N runs of one config trained in one jitted step (``config.num_seeds``).

The seeds ``seed, seed + 1, ..., seed + N - 1`` are N runs of their own: seed ``K`` trains in
``WORKDIR/seed<K>/``, a complete workdir whose ``config.json`` is the lone run's (``seed=K``,
``num_seeds=1``), so ``--mode=eval``, ``--mode=analyze`` and a resume of that directory alone work
as for any run. ``WORKDIR/config.json`` keeps the side-by-side config, so the same command, or
``--workdir=WORKDIR`` alone, resumes all seeds. A field that refers to the seed (``init.seed`` of
the structured-init configs) is saved as a reference (``saved_config.seed_references``), so that
restart gives seed ``K`` the config it had, ``WORKDIR/seed<K>/config.json``, even before its first
checkpoint (a killed run's seeds initialise again). A seed's config that a restart could not
rebuild is refused before anything is created (``check_restart_rebuilds_seeds``): a field
computed from the seed, or a ``WORKDIR/config.json`` of an earlier locvit that kept such a
field's value alone.

What stacks, and how each seed stays its lone run:

- The N training states are stacked on a leading seed axis (``stack``). The seed axis is
  replicated over the mesh: each seed's arrays keep the lone run's layout (data-parallel,
  tensor-parallel or FSDP), one copy per seed on the same devices (``stacked_shardings``).
- The step is ``jax.vmap`` of the lone run's ``guarded_steps`` over the state, the batches, the
  non-finite record and the seed (``make_step``). The seed is an operand of the step, from which
  ``train_step`` derives the dropout, augmentation and recipe keys as the lone run does from
  ``config.seed``; each seed reads its own data order (``Training.train_batches`` of its config)
  and is initialised by its own config (``config.init``'s solves included) before stacking.
  A frozen teacher and the training split on the device are shared, unmapped operands.
- Evaluation is one jitted pass over the test split for all seeds: the lone run's ``eval_step``
  vmapped over the stacked state (``evaluation.make_eval_step(over_seeds=True)``), each test batch
  read once and shared, the model's and the EMA's weights evaluated as alone; its sums carry the
  seed axis and split into each seed's metrics (``split_metrics``), logged in the seed's workdir.
  One program per test batch for all seeds, as the step is one for all seeds, not N in a row.
- Checkpoints, ``best/`` (each seed's own best) and the analysis hooks run per seed on its slice of
  the stacked state (``SeedStates.take``), through the lone run's code; the slice is taken only
  where one of them needs it.

Why not bitwise: ``vmap`` batches each matrix product over the seed axis, and XLA may tile and
accumulate a batched product in another order than the lone one, so losses, evaluations and
parameters agree with the lone run to float32 rounding (tests/test_seeds.py states the
tolerance), not bit for bit.

A resume of the side-by-side run restores each seed's newest intact checkpoint and stacks them;
the seeds must then stand at the same step (a seed resumed or stopped on its own can be finished
alone, with ``--workdir=WORKDIR/seed<K>``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from locvit.platform import sharding
from locvit.run import bundle
from locvit.run.step import guarded_steps, initial_health
from locvit.workdir import paths, saved_config

SEED_DIR_PREFIX = "seed"


def seeds_of(config: ml_collections.ConfigDict) -> list[int]:
  """The seeds ``config`` trains: ``seed, seed + 1, ..., seed + num_seeds - 1``."""
  return [config.seed + k for k in range(config.num_seeds)]


def seed_workdir(workdir: str, seed: int) -> str:
  """Where seed ``seed`` of a side-by-side run in ``workdir`` trains: ``workdir/seed<seed>``."""
  return str(paths.path(workdir) / f"{SEED_DIR_PREFIX}{seed}")


def seed_config(config: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
  """The config of seed ``seed`` trained alone: ``config`` with that seed and ``num_seeds=1``, as
  ``--config.seed`` sets it (a field that refers to the seed, such as ``init.seed`` in the
  structured-init configs, follows it; also in a config read back from ``config.json``)."""
  config = copy.deepcopy(config)  # keeps the config's references; to_dict() would resolve them
  config.seed, config.num_seeds = seed, 1
  return config


def check_restart_rebuilds_seeds(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses, before any workdir is claimed, seeds whose configs a restart from
  ``WORKDIR/config.json`` alone (``--workdir``) would not rebuild exactly (``config.json`` keeps a
  field that is the seed itself as a reference, any other as its value)."""
  root_file = saved_config.path(workdir)
  saved = saved_config.from_record(saved_config.record(config, argv=[]))
  for seed in seeds_of(config):
    want = saved_config.leaves(seed_config(config, seed))
    got = saved_config.leaves(seed_config(saved, seed))
    name = next((name for name in want if got.get(name) != want[name]), None)
    if name is not None:
      raise ValueError(
        f"--config.num_seeds={config.num_seeds}: {name} is computed from the seed ({want[name]!r} "
        f"for seed {seed}), and {root_file} would keep it as the value {got.get(name)!r}, so a "
        "restart would not rebuild it: make it the seed itself (get_ref('seed')) or a fixed "
        f"value, or train each seed as a run of its own (--config.seed={seed} --config.num_seeds=1)"
      )
  check_seed_followers_kept(config, workdir)


def saved_seed_leaves(config: ml_collections.ConfigDict, workdir: str) -> dict[int, dict]:
  """Seed -> the fields of its saved ``WORKDIR/seed<K>/config.json`` (``saved_config.leaves``),
  for the seeds that have a readable one (a missing or damaged one is written again)."""
  found = {}
  for seed in seeds_of(config):
    try:
      found[seed] = saved_config.leaves(
        saved_config.read(str(saved_config.path(seed_workdir(workdir, seed))))
      )
    except (ValueError, OSError):
      continue
  return found


def check_seed_followers_kept(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a restart that would lose a field following the seed: one equal to the seed in each
  saved ``WORKDIR/seed<K>/config.json`` that ``config`` does not set so (a ``WORKDIR/config.json``
  saved by an earlier locvit, which kept such a field's value alone, the same for every seed)."""
  saved = saved_seed_leaves(config, workdir)
  if len(saved) < 2:
    return  # a field follows the seed only if it differs between seeds
  first = next(iter(saved.values()))
  for name in (name for name in first if name != "seed"):
    if not all(leaves.get(name) == seed for seed, leaves in saved.items()):
      continue
    for seed in saved:
      given = saved_config.leaves(seed_config(config, seed)).get(name)
      if given != seed:
        raise ValueError(
          f"{name} follows the seed in each seed's config.json ({seed_workdir(workdir, seed)}/"
          f"config.json: {name}={seed}), but this restart gives seed {seed} {name}={given!r} (as "
          f"a {saved_config.path(workdir)} saved by an earlier locvit does, which kept the value "
          "alone): restart with the original --config and its overrides, or finish each seed "
          f"alone with --workdir={seed_workdir(workdir, seed)} (and the others' seed<K>)"
        )


def check_process_count(num_seeds: int) -> None:
  """Seeds side by side run in one process (each seed's data order and workdir are this
  process's); several processes train one run each."""
  if num_seeds > 1 and jax.process_count() > 1:
    raise ValueError(
      f"--config.num_seeds={num_seeds} runs in one process, but this run has "
      f"{jax.process_count()}: train the seeds side by side on one host's devices, or train each "
      "seed as a run of its own (--config.seed=K --config.num_seeds=1)."
    )


# ------------------------------------------------------------------------------------------------
# Memory: estimated from the state's shapes, before anything is compiled


def device_memory_bytes(device: jax.Device) -> int | None:
  """The memory ``device`` lets JAX allocate, or None where the backend does not say (CPU)."""
  stats = device.memory_stats()
  return stats.get("bytes_limit") if stats else None


def state_bytes_per_device(abstract_state: Any) -> int:
  """The bytes one device holds of a state with these shapes and shardings (its shards)."""
  total = 0
  for leaf in jax.tree.leaves(abstract_state):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += int(np.prod(shape)) * jnp.dtype(leaf.dtype).itemsize
  return total


def check_fits_memory(
  abstract_state: Any, num_seeds: int, limit: int | None, device_name: str
) -> None:
  """Refuses ``num_seeds`` states that alone exceed ``limit`` bytes per device (None: unknown,
  nothing refused). A lower bound of the step's need: activations come on top."""
  if limit is None or num_seeds <= 1:
    return
  per_seed = state_bytes_per_device(abstract_state)
  if num_seeds * per_seed <= limit:
    return
  gib = 2.0**30
  raise ValueError(
    f"--config.num_seeds={num_seeds}: the {num_seeds} training states alone need "
    f"{num_seeds * per_seed / gib:.2f} GiB per device ({per_seed / gib:.2f} GiB each: parameters, "
    f"optimizer state, EMA), more than the {limit / gib:.2f} GiB of the {device_name}; at most "
    f"{limit // per_seed} fit before activations: lower --config.num_seeds."
  )


# ------------------------------------------------------------------------------------------------
# The runs: one Training per seed, sharing what does not depend on the seed


def build_runs(
  config: ml_collections.ConfigDict, workdir: str, **hooks: Callable | None
) -> list[bundle.Training]:
  """The runs of ``config``'s seeds, ``WORKDIR/seed<K>`` each: checked once (the config, then its
  states' memory) before any workdir is claimed. The seeds share the mesh, data sources, model,
  optimizer, state layout, teacher and the training split on the device."""
  started = time.monotonic()
  check_process_count(config.num_seeds)
  check_restart_rebuilds_seeds(config, workdir)
  seeds = seeds_of(config)
  shared = bundle.checked_setup(seed_config(config, seeds[0]), hooks, started)
  device = jax.devices()[0]
  check_fits_memory(
    shared.layout.abstract, len(seeds), device_memory_bytes(device), device.device_kind
  )
  runs: list[bundle.Training] = []
  try:
    for seed in seeds:
      # shared.config: completed and checked (with init_from's pruned heads applied, if any)
      seed_run = seed_config(shared.config, seed)
      warmstart = shared.warmstart
      if seed != seeds[0] and seed_run.init_from is not None and seed_run.init_from.get("weights"):
        # published weights fitted with a fresh head: each seed draws its own, as alone
        warmstart = bundle.weights_warmstart(seed_run, shared.num_classes)
      run = dataclasses.replace(
        shared,
        config=seed_run,
        warmstart=warmstart,
        teacher=runs[0].teacher if runs else None,  # after the first, the first run's
      )
      runs.append(bundle.open_workdir(run, seed_workdir(workdir, seed)))  # closes it if it fails
  except BaseException as e:
    close_runs(runs, e)
    raise
  return runs


@contextlib.contextmanager
def closing(runs: list[bundle.Training]):
  """Closes ``runs`` (``close_runs``) when the block ends, however it ends: the runs the list
  holds then, so a run replaced in it by a later stage's (``locvit.train.start_session``) is
  closed with what that stage added."""
  try:
    yield runs
  except BaseException as e:
    close_runs(runs, e)
    raise
  close_runs(runs)


def close_runs(runs: Sequence[bundle.Training], exc: BaseException | None = None) -> None:
  """Closes each run (checkpointer, writer, workdir lock), all of them even when one fails."""
  if not runs:
    return
  try:
    runs[0].__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
  finally:
    close_runs(runs[1:], exc)


# ------------------------------------------------------------------------------------------------
# The stacked state and the vmapped step


def stacked_sharding(one: NamedSharding) -> NamedSharding:
  """``one`` with a leading, replicated seed axis."""
  return NamedSharding(one.mesh, P(None, *one.spec))


def stacked_shardings(shardings: Any) -> Any:
  """The shardings of a stacked tree whose seeds are laid out as ``shardings``."""
  return jax.tree.map(stacked_sharding, shardings)


class SeedStates:
  """Stacks the seeds' trees laid out as ``shardings`` (a lone run's) and takes them apart again:
  one compiled program each way."""

  def __init__(self, shardings: Any):
    self.shardings, self.stacked_shardings = shardings, stacked_shardings(shardings)
    self._stack = jax.jit(
      lambda *trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees),
      out_shardings=self.stacked_shardings,
    )
    self._take = jax.jit(
      lambda tree, index: jax.tree.map(lambda x: x[index], tree), out_shardings=shardings
    )

  def stack(self, trees: Sequence[Any]) -> Any:
    """``trees``, one per seed, stacked on a leading seed axis."""
    return self._stack(*trees)

  def take(self, stacked: Any, index: int) -> Any:
    """Seed ``index``'s tree of ``stacked``, laid out as a lone run's: what its checkpoint and
    analysis read."""
    return self._take(stacked, jnp.int32(index))


def stacked_health(num_seeds: int, mesh) -> dict[str, jax.Array]:
  """The non-finite record of each seed (``step.initial_health``), stacked."""
  return jax.device_put(
    jax.tree.map(lambda x: jnp.stack([x] * num_seeds), initial_health()),
    sharding.replicated(mesh),
  )


def stacked_batch(local_batches: Sequence[dict[str, np.ndarray]], batch_sharding) -> dict:
  """The seeds' batches of one step (this process's rows each) as one global batch with a
  leading seed axis; the rows of each seed split as a lone run's."""
  local = jax.tree.map(lambda *xs: np.stack(xs), *local_batches)
  return sharding.global_batch(local, stacked_sharding(batch_sharding))


def make_step(seeds: Sequence[int], **step_kwargs) -> Callable:
  """``guarded_steps`` vmapped over the seeds: ``step(state, batches, teacher_variables, health,
  train_split)`` with ``state``, each batch and ``health`` stacked on a leading seed axis, the
  teacher's variables and the training split on the device shared. Each lane draws its keys from
  its seed as the lone run of that seed does. Jit it as the lone step."""
  seed_values = jnp.asarray(seeds, jnp.int32)

  def step(state, batches, teacher_variables, health, train_split=()):
    def one_seed(state, batches, health, seed):
      return guarded_steps(
        state, batches, teacher_variables, health, train_split, seed=seed, **step_kwargs
      )

    return jax.vmap(one_seed)(state, batches, health, seed_values)

  return step


def seed_slice(tree: Any, index: int) -> Any:
  """Seed ``index``'s entries of a stacked tree already on the host (metrics, health)."""
  return jax.tree.map(lambda x: x[index], tree)


def split_metrics(metrics: dict[str, list], num_seeds: int) -> list[dict[str, Any]]:
  """The metrics of each seed, from metrics holding one entry per seed in each value (the
  evaluation of seeds side by side, ``evaluation.evaluate``)."""
  return [{key: values[k] for key, values in metrics.items()} for k in range(num_seeds)]
