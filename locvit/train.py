"""The training loop, readable top to bottom.

    build the run (``locvit.run.bundle``: mesh, data, model, optimizer, state layout, teacher,
    checkpointer, writer) -> resume from the workdir (or initialise) -> loop: step, log, save,
    evaluate, analysis hooks, preemption.

The step itself (augmentation, distillation, gradient accumulation, EMA, non-finite guard) is
``locvit.run.step``; the state and its shardings ``locvit.run.state``; when the loop acts on the
host ``locvit.run.cadence``. With ``config.num_seeds > 1`` the same loop trains several seeds side
by side: one vmapped step over their stacked states (``locvit.run.seeds``), at an evaluation step
one vmapped evaluation of them (``StepEvaluation``), then each seed's host work (``after_dispatch``:
log, its evaluation's row, save) in its own workdir, on its slice of the states where a save or an
analysis hook needs one.

Determinism: the dropout key of step ``s`` is ``fold_in(key(seed), s)``, the augmentation key
``fold_in(key(seed + 2), s)``, and the data position is a function of the global step, so a run
stopped by SIGTERM and resumed reproduces the uninterrupted run (bitwise on CPU), and resumes on
another process or device count too (same data order; the loss agrees to reduction-order rounding,
docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import typing
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
from absl import logging

from locvit import metrics as metrics_lib
from locvit.configs.common import complete_config
from locvit.data import device_augment
from locvit.platform import sharding, xla_options
from locvit.run import bundle, evaluation
from locvit.run import seeds as seeds_lib
from locvit.run.cadence import RunAhead, dispatch_end, is_evaluation_step, is_log_step, is_save_step
from locvit.run.preemption import EvaluationInterruptedError, PreemptionWatcher
from locvit.run.state import TrainState, apply_initializer
from locvit.run.step import (
  NonFiniteError,
  all_finite,
  check_finite_state,
  check_health,
  guarded_steps,
  initial_health,
  step_arguments,
)
from locvit.workdir import checkpoint, fingerprint, lock, paths, provenance, saved_config

# ------------------------------------------------------------------------------------------------
# Loop helpers, in the order the loop calls them


def restore_or_initialise(run: bundle.Training) -> tuple[int, TrainState]:
  """``(start step, state)``: the newest intact checkpoint of the workdir, else a fresh state
  (``config.init`` or ``init_from`` applied). Runs inside the run's mesh."""
  config, layout, checkpointer = run.config, run.layout, run.checkpointer

  def restore_step(step):
    restored = checkpointer.restore(step, layout.abstract)
    if not all_finite(restored):
      raise checkpoint.DamagedCheckpointError("non-finite values in the restored state")
    return restored

  start, state, meta = checkpointer.restore_newest_intact(
    restore_step,
    lambda meta: fingerprint.check_compatible(meta["config"], config, run.workdir, run.num_classes),
  )
  if jax.process_index() == 0:  # accepted: only now replace the config.json of the workdir
    saved_config.write(run.workdir, config)
  if start is not None:
    fingerprint.report_changed_hyperparameters(meta, config, run.workdir, start)
    run.writer.truncate_after(start)
    logging.info("Resumed from step %d in %s", start, run.workdir)
    keep_best_honest(run, start)
  else:
    start = 0
    run.writer.truncate_after(-1)  # rows of an earlier attempt killed before its first checkpoint
    init_rng = jax.random.key(config.seed + 1)  # separate stream from dropout keys
    state = jax.jit(layout.init, out_shardings=layout.shardings)(init_rng)
    state = apply_initializer(config, state, run.model, run.tx, layout.shardings, run.warmstart)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  logging.info(
    "%s: %.2fM parameters; %d steps", config.model.name, num_params / 1e6, run.total_steps
  )
  return start, state


def start_session(run: bundle.Training, start: int) -> bundle.Training:
  """``run`` with this session's entry of ``DIR/commits.json`` (``locvit.workdir.provenance``:
  the commit that trains on from ``start``; ``run.session`` then records each checkpoint's step,
  and the run's exit the session's wall time), as a new run; ``run`` itself on other processes
  or when no step is left."""
  if jax.process_index() != 0 or start >= run.total_steps:
    return run
  session = provenance.record_start(run.workdir, start + 1, run.started, run.watch)
  run.checkpointer.on_saved(session.checkpointed)  # a killed run keeps its last save's time
  return dataclasses.replace(run, session=session)


def keep_best_honest(run: bundle.Training, start: int) -> None:
  """A resumed workdir without ``checkpoints/best`` (moved without it, as ``locvit.reproduce
  --pack`` does) saves a new best only when it beats every evaluation logged up to ``start``."""
  if run.checkpointer.best_step() is not None:
    return
  logged = [
    row[checkpoint.BEST_METRIC]
    for row in metrics_lib.read_metrics(run.workdir)
    if row["step"] <= start and checkpoint.BEST_METRIC in row
  ]
  if logged:
    run.checkpointer.set_best_score_to_beat(max(logged))
    logging.warning(
      "No best checkpoint in %s: the next one must beat %s %.4f, the best logged so far.",
      run.workdir,
      checkpoint.BEST_METRIC,
      max(logged),
    )


def make_step_fn(run: bundle.Training, seed_values: list[int] | None = None) -> Callable:
  """The jitted, donating ``guarded_steps(state, batches, teacher_variables, health)``: one
  optimizer step per batch of the list ``batches``, in one dispatch, compiled with the XLA options
  of ``config.xla_options``; the training split on the device, if any, is passed to each call.
  With ``seed_values``, the step of those seeds side by side (``locvit.run.seeds.make_step``):
  state, batches and health stacked on a leading seed axis. The backend is resolved here, once,
  and passed down: to the step (its kernels and augmentation) and to the XLA options."""
  replicated, shardings = sharding.replicated(run.mesh), run.layout.shardings
  platform = jax.default_backend()
  step_kwargs = step_arguments(run, teacher=run.teacher, platform=platform)
  step = functools.partial(guarded_steps, **step_kwargs)
  batch_sharding = run.batch_sharding
  if seed_values is not None:
    step = seeds_lib.make_step(seed_values, **step_kwargs)
    shardings = seeds_lib.stacked_shardings(shardings)
    batch_sharding = seeds_lib.stacked_sharding(batch_sharding)
  options = xla_options.compiler_options(run.config.xla_options, platform)
  jitted = jax.jit(
    step,
    in_shardings=(
      shardings,
      batch_sharding,
      run.teacher.shardings if run.teacher else (),
      replicated,
      replicated,  # the training split on the device: any example may be any step's row
    ),
    out_shardings=(shardings, replicated, replicated),
    donate_argnums=(0, 3),
    compiler_options=options or None,
  )
  train_split = run.train_split
  return lambda state, batches, teacher_variables, health: jitted(
    state, batches, teacher_variables, health, train_split
  )


class AnalysisHooks:
  """Per-evaluation analysis asked by ``config.analysis``: locality metrics (nonlocality, gates,
  centres) and centre plots; their curves (ConViT Figs. 5-6) start at initialisation."""

  def __init__(self, run: bundle.Training, state: TrainState, start: int):
    make_logger, make_plotter = (
      run.hooks.get("make_locality_logger"),
      run.hooks.get("make_center_plotter"),
    )
    analysis = run.config.analysis
    self.asked = analysis is not None and bool(analysis.locality or analysis.center_plots)
    self.locality_fn = None
    if make_logger is not None:
      self.locality_fn = make_logger(run.config, run.model, run.mesh, run.eval_source)
    if self.locality_fn is not None and start == 0:
      run.writer.write(0, self.locality_fn(state.params))
    self.plot_centers = lambda step, params: None
    if make_plotter is not None:
      self.plot_centers = make_plotter(run.config, state.params, run.workdir)
    if start == 0:
      self.plot_centers(0, state.params)

  def __call__(self, step: int, state_of: Callable[[], TrainState]) -> dict[str, Any]:
    """The analysis of the state ``state_of()`` at ``step``, asked only when ``config.analysis``
    asks for some (a seed side by side then takes its slice of the stacked states)."""
    if not self.asked:
      return {}
    params = state_of().params
    record = self.locality_fn(params) if self.locality_fn is not None else {}
    self.plot_centers(step, params)
    return record


class HealthMonitor:
  """Reads the on-device non-finite record at log and save steps (``check_health``)."""

  def __init__(self, config: ml_collections.ConfigDict, name: str = ""):
    self.config, self.warned, self.name = config, 0, name

  def check(self, health, step: int) -> None:
    """Stops (or warns about skipped updates) per ``config.nonfinite`` at ``step``."""
    health = jax.device_get(health)
    self.warned = check_health(self.config, health, step, self.warned, self.name)


def log_train_metrics(run, step: int, train_metrics, progress) -> dict[str, Any]:
  """The ``train/*`` row of ``step``: loss, accuracy, lr, grad norm, rates, epoch."""
  record = dict(jax.device_get(train_metrics))
  record.update(progress.update(step, float(record["train/loss"])))
  record["epoch"] = step / run.steps_per_epoch
  return record


def save_checkpoint(run, step: int, state: TrainState, meta, progress) -> None:
  """Saves ``step`` (never a non-finite state; the save records it in ``DIR/commits.json`` with
  the session's wall time, ``restore_or_initialise``); the progress line shows how long the loop
  was held, and how much of it waiting for the previous save to be committed."""
  check_finite_state(state, step)
  save_start = time.perf_counter()
  run.checkpointer.save(step, state, meta, force=True)
  progress.checkpoint(time.perf_counter() - save_start, waited=run.checkpointer.waited)


def evaluation_record(
  lane, step: int, state_of: Callable[[], TrainState], evaluation_of: Callable
) -> dict[str, Any]:
  """Sets ``lane.final`` to ``step``'s evaluation (``evaluation_of()``: its metrics and seconds)
  and returns it for the metrics row, with the analysis and the evaluation's time (the analysis
  included), after printing its line."""
  lane.final, seconds = evaluation_of()
  analysis_start = time.perf_counter()
  record = {**lane.final, **lane.analysis(step, state_of)}
  seconds += time.perf_counter() - analysis_start
  record.update(lane.progress.evaluation(step, lane.final, seconds))
  return record


def evaluate_unevaluated_step(
  lane, step: int, state_of: Callable[[], TrainState], evaluation_of: Callable
) -> dict[str, Any]:
  """The evaluation of the resumed ``step`` (an evaluation step) when the run that saved it
  logged none: it was stopped during the evaluation (or the evaluation failed). Evaluates now
  and rewrites the step's row with it, and saves ``best/``, as the uninterrupted run would have:
  each step is logged once, with its evaluation. ``{}`` when the step's row has its evaluation."""
  run = lane.run
  rows = [row for row in metrics_lib.read_metrics(run.workdir) if row["step"] == step]
  if rows and "eval/top1" in rows[-1]:
    return {}
  logging.info("Step %d was saved without its evaluation; evaluating it now.", step)
  record = {key: value for key, value in (rows[-1] if rows else {}).items() if key != "step"}
  record.update(evaluation_record(lane, step, state_of, evaluation_of))
  run.writer.truncate_after(step - 1)
  run.writer.write(step, record)
  run.writer.flush()
  run.checkpointer.save_best(step, state_of(), lane.meta, lane.final)
  return lane.final


# ------------------------------------------------------------------------------------------------
# The loop


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  make_locality_logger: Callable | None = None,
  make_center_plotter: Callable | None = None,
  on_setup: Callable[[], None] | None = None,
) -> dict[str, Any]:
  """Trains per ``config``, resuming from ``workdir`` if it holds a checkpoint.

  The optional analysis hooks (``locvit.analysis.hooks.training_hooks()``) run at each evaluation
  when ``config.analysis`` asks: ``make_locality_logger(config, model, mesh, eval_source)``
  returns ``fn(params) -> metrics`` or None, ``make_center_plotter(config, params, workdir)``
  returns ``fn(step, params)``. ``on_setup()`` runs once the config and data have passed their
  checks and the workdir is claimed, before the state is restored or initialised.

  Returns the final evaluation metrics (plus ``preempted=True`` if stopped by SIGTERM). With
  ``config.num_seeds > 1`` the seeds train side by side (``train_side_by_side``).
  """
  hooks = dict(make_locality_logger=make_locality_logger, make_center_plotter=make_center_plotter)
  if complete_config(config).num_seeds > 1:
    return train_side_by_side(config, workdir, on_setup=on_setup, **hooks)
  runs = [bundle.build_training(config, workdir, **hooks)]  # a new run once its session starts
  with seeds_lib.closing(runs):
    if on_setup is not None:
      on_setup()
    runs[0].checkpointer.check_best()
    with jax.set_mesh(runs[0].mesh), nn.logical_axis_rules(runs[0].rules):
      start, state = restore_or_initialise(runs[0])
      runs[0] = start_session(runs[0], start)
      return train_loop(runs, start, [state])[0]


def train_side_by_side(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  on_setup: Callable[[], None] | None = None,
  **hooks: Callable | None,
) -> dict[str, Any]:
  """Trains the ``config.num_seeds`` seeds of ``config`` in one jitted step, each a run of its
  own in ``workdir/seed<K>`` (``locvit.run.seeds``); ``workdir/config.json`` keeps ``config``.
  Resumes when the seeds' newest checkpoints are at one step. Returns ``{'seeds': {K: final
  metrics}}``, plus ``preempted`` and ``step`` when stopped by SIGTERM."""
  config = complete_config(config)
  runs = seeds_lib.build_runs(config, workdir, **hooks)  # each a new run once its session starts
  with seeds_lib.closing(runs):
    if on_setup is not None:
      on_setup()
    for run in runs:
      run.checkpointer.check_best()
    with jax.set_mesh(runs[0].mesh), nn.logical_axis_rules(runs[0].rules):
      started = []
      for k, run in enumerate(runs):
        started.append(restore_or_initialise(run))
        runs[k] = start_session(run, started[-1][0])
      starts = {run.config.seed: start for run, (start, _) in zip(runs, started)}
      if len(set(starts.values())) > 1:
        raise ValueError(
          f"the seeds of {workdir} stand at different steps ("
          + ", ".join(f"seed{seed}: {step}" for seed, step in starts.items())
          + "), and side by side they train in step: finish each seed alone with "
          f"--workdir={seeds_lib.seed_workdir(workdir, config.seed)} (and the others' seed<K>)."
        )
      if jax.process_index() == 0:
        saved_config.write(workdir, config)
      start, states = started[0][0], [state for _, state in started]
      del started  # train_loop stacks the states and lets go of them
      finals = train_loop(runs, start, states)
  result: dict[str, Any] = {"seeds": {run.config.seed: final for run, final in zip(runs, finals)}}
  preempted = [final for final in finals if final.get("preempted")]
  if preempted:
    result.update(preempted=True, step=preempted[0]["step"])
  return result


@dataclasses.dataclass
class Lane:
  """One run's part of the loop on the host: its run, progress, analysis and health, the
  evaluation it logged last, and why it stopped if it stopped before the others (a seed side by
  side)."""

  run: bundle.Training
  progress: metrics_lib.Progress
  analysis: AnalysisHooks
  monitor: HealthMonitor
  meta: dict[str, Any]
  final: dict[str, Any] = dataclasses.field(default_factory=dict)
  stopped: NonFiniteError | None = None


def make_lanes(runs, start: int, states: list[TrainState]) -> list[Lane]:
  """A lane per run; runs side by side name themselves by their workdir's name."""
  lanes = []
  for run, state in zip(runs, states):
    name = str(paths.path(run.workdir).name) if len(runs) > 1 else ""
    progress = metrics_lib.Progress(run.total_steps, run.config.batch_size, start, name)
    monitor = HealthMonitor(run.config, name)
    meta = fingerprint.checkpoint_meta(run.config, run.num_classes)
    lanes.append(Lane(run, progress, AnalysisHooks(run, state, start), monitor, meta))
  return lanes


def train_loop(
  runs: list[bundle.Training], start: int, states: list[TrainState]
) -> list[dict[str, Any]]:
  """Steps ``start + 1 .. total_steps`` of ``runs`` from their ``states`` at ``start``: train,
  log, save, evaluate, analyse, stop if preempted. One run trains alone; several are seeds side by
  side, their states stacked (``locvit.run.seeds``; ``states`` is emptied, so that only the stack
  holds them). Each pass runs the steps of one dispatch (``dispatch_end``) and acts on its last
  step, for each run. Returns each run's final evaluation (or ``{'preempted': True, 'step':
  ...}``)."""
  run = runs[0]  # what the runs share: config but the seed, mesh, model, data sources, length
  config, total_steps = run.config, run.total_steps
  side_by_side = len(runs) > 1
  seed_states = seeds_lib.SeedStates(run.layout.shardings) if side_by_side else None
  step_fn, health = make_step_fn_and_health(runs)
  teacher_variables = run.teacher.variables if run.teacher else ()
  eval_fn = evaluation.make_eval_step(
    run.model,
    run.mesh,
    run.rules,
    (run.layout.shardings.params, run.layout.shardings.model_state),
    functools.partial(device_augment.normalize, data_config=config.data),
    over_seeds=side_by_side,
  )
  lanes = make_lanes(runs, start, states)
  state = seed_states.stack(states) if side_by_side else states[0]
  states.clear()

  def lane_state(k: int) -> TrainState:
    return seed_states.take(state, k) if side_by_side else state

  def lane_tree(tree, k: int):
    return jax.tree.map(lambda x: x[k], tree) if side_by_side else tree

  watcher = PreemptionWatcher(multiprocess=jax.process_count() > 1, checkpointer=run.checkpointer)
  run_ahead = RunAhead()
  # closing: stops grain's worker processes (data.num_workers) however the loop ends.
  with watcher as preemption, contextlib.ExitStack() as iterators:
    train_batches = [
      iterators.enter_context(contextlib.closing(r.train_batches(start))) for r in runs
    ]
    resumed_unevaluated = start and is_evaluation_step(config, start, total_steps)
    if resumed_unevaluated and not evaluate_resumed_step(
      lanes, start, lane_state, StepEvaluation(lanes, state, eval_fn, preemption)
    ):
      return [{"preempted": True, "step": start} for _ in lanes]
    if start >= total_steps:
      for lane in lanes:
        lane.final = lane.final or metrics_lib.last_evaluation(lane.run.workdir)
        lane.progress.finished(lane.run.workdir, lane.final)
    step = start
    while step < total_steps and not all(lane.stopped for lane in lanes):
      first, step = step + 1, dispatch_end(config, step, start, total_steps)
      batches = next_batches(run, train_batches, step - first + 1, side_by_side)
      run_ahead.wait()
      state, train_metrics, health = step_fn(state, batches, teacher_variables, health)
      run_ahead.dispatched(train_metrics)
      # Every step is asked (processes agree on a preemption step); the dispatch's last one stops.
      preempted = any([preemption.should_stop(s) for s in range(first, step + 1)])
      step_evaluation = StepEvaluation(lanes, state, eval_fn, preemption)
      if side_by_side and is_evaluation_step(config, step, total_steps):
        step_evaluation.run()  # now, for all seeds: its time is each seed's, left out once
      outcomes = {}
      for k, lane in enumerate(lanes):
        lane_outputs = (
          functools.partial(lane_state, k),
          functools.partial(lane_tree, train_metrics, k),
          functools.partial(lane_tree, health, k),
          functools.partial(step_evaluation, k),
        )
        began = time.perf_counter()
        outcome = lane_after_dispatch(lane, side_by_side, step, start, lane_outputs, preempted)
        for other in lanes:
          if other is not lane:
            other.progress.pause(time.perf_counter() - began)
        if outcome is not None:
          outcomes[k] = outcome
      if any(outcome.stop for outcome in outcomes.values()):
        save_and_stop(lanes, outcomes, step, lane_state)
        break
  raise_for_stopped_seeds(lanes)
  return [lane.final for lane in lanes]


def lane_after_dispatch(lane, side_by_side, step, start, lane_outputs, preempted):
  """``after_dispatch`` for one lane, None for a lane already stopped. A seed side by side whose
  update turns non-finite stops alone (its lane keeps computing); a run alone raises."""
  if lane.stopped:
    return None
  try:
    return after_dispatch(lane, step, start, *lane_outputs, preempted)
  except NonFiniteError as e:
    if not side_by_side:
      raise
    lane.stopped = e  # this seed only: the others train on
    logging.error("%s; the other seeds train on.", e)
    return None


def make_step_fn_and_health(runs: list[bundle.Training]) -> tuple[Callable, Any]:
  """The jitted step of ``runs`` (several: seeds side by side, one vmapped step) and its initial
  on-device non-finite record, one per seed."""
  run = runs[0]
  if len(runs) > 1:
    step_fn = make_step_fn(run, [r.config.seed for r in runs])
    return step_fn, seeds_lib.stacked_health(len(runs), run.mesh)
  return make_step_fn(run), jax.device_put(initial_health(), sharding.replicated(run.mesh))


def evaluate_resumed_step(lanes, start: int, lane_state, step_evaluation) -> bool:
  """Evaluates the resumed step ``start`` for each lane whose run saved it unevaluated
  (``evaluate_unevaluated_step``; side by side, one evaluation of all seeds, run when the first
  lane asks); False when a stop request cut the evaluation short."""
  for k, lane in enumerate(lanes):
    state_of = functools.cache(functools.partial(lane_state, k))
    try:
      lane.final = evaluate_unevaluated_step(
        lane, start, state_of, functools.partial(step_evaluation, k)
      )
    except EvaluationInterruptedError as e:
      logging.warning("Stop requested while evaluating step %d: %s; exiting.", start, e)
      return False
  return True


def next_batches(run: bundle.Training, train_batches, count: int, side_by_side: bool) -> list:
  """The global batches of the next ``count`` steps: each run's next rows, stacked over the seeds
  side by side."""
  local = [[next(batches) for _ in range(count)] for batches in train_batches]
  if side_by_side:
    return [seeds_lib.stacked_batch(rows, run.batch_sharding) for rows in zip(*local)]
  return [sharding.global_batch(b, run.batch_sharding) for b in local[0]]


def save_and_stop(lanes, outcomes, step: int, lane_state) -> None:
  """A stop request: every seed saves the step, also one whose evaluation went unstopped, and
  records that it was preempted there (unless it finished: the last step, evaluated)."""
  for k, outcome in outcomes.items():
    if not outcome.saved:
      save_step(lanes[k], step, lane_state(k), {}, evaluated=outcome.evaluated)
    if outcome.stop or not outcome.saved:  # else finished: the last step, evaluated
      lanes[k].final = {"preempted": True, "step": step}
    lanes[k].run.checkpointer.wait()
  logging.warning("Preempted: checkpoint saved at step %d; exiting.", step)


def raise_for_stopped_seeds(lanes) -> None:
  """One NonFiniteError naming every seed that stopped on a non-finite update, once the others
  have trained to the end."""
  stopped = [lane.stopped for lane in lanes if lane.stopped]
  if stopped:
    raise NonFiniteError(
      "; ".join(str(e) for e in stopped)
      + f" The other {len(lanes) - len(stopped)} of the {len(lanes)} seeds trained on."
    )


class Dispatched(typing.NamedTuple):
  """What one run did after a dispatch: saved its step, evaluated it, stops for a stop request."""

  saved: bool
  evaluated: bool
  stop: bool


def after_dispatch(
  lane: Lane,
  step: int,
  start: int,
  state_of: Callable[[], TrainState],
  train_metrics_of: Callable[[], Any],
  health_of: Callable[[], Any],
  evaluation_of: Callable[[], tuple[dict[str, Any], float]],
  preempted: bool,
) -> Dispatched:
  """One run's host work after the dispatch that ended at ``step``: health, its training row,
  evaluation and analysis, the metrics row, the checkpoint and ``best/``. ``state_of`` and the
  others give the run's part of the dispatch's outputs when asked (a seed's slice, taken once);
  ``evaluation_of`` its evaluation of the step and the seconds it took (``StepEvaluation``)."""
  run, writer = lane.run, lane.run.writer
  state_of = functools.cache(state_of)
  config, total_steps = run.config, run.total_steps
  last = step == total_steps
  run.checkpointer.check_for_errors(step)  # an async save that failed stops the run here
  record = {}
  on_grid = is_log_step(config, step, total_steps)
  if on_grid or step == start + 1:  # a resumed run's first step: a progress line only
    lane.monitor.check(health_of(), step)
    lock.check_lock(run.workdir)
    train_row = log_train_metrics(run, step, train_metrics_of(), lane.progress)
    # The rows of an uninterrupted run: a point one step after the resume would draw the noise of
    # a single batch as a jump in the loss curve.
    record.update(train_row if on_grid else {})
  save = is_save_step(config, step, total_steps) or preempted
  if save:
    lane.monitor.check(health_of(), step)
  # A step's metrics row is durable before the checkpoint that covers it: a resumed run starts at
  # a checkpoint and logs every later step again, so each step is logged exactly once.
  if is_evaluation_step(config, step, total_steps):
    try:
      record.update(evaluation_record(lane, step, state_of, evaluation_of))
    except EvaluationInterruptedError as e:  # within the grace period: save now, without it
      logging.warning(
        "Stop requested at step %d: %s; saving the step without it (the resumed run evaluates it).",
        step,
        e,
      )
      lane.final, save, preempted = {}, True, True
    except BaseException:  # a failing evaluation loses no training: keep the step and its row
      if save:
        save_step(lane, step, state_of(), record, evaluated=False)
      raise
  evaluated = "eval/top1" in record
  if save:
    save_step(lane, step, state_of(), record, evaluated)
  elif record:
    writer.write(step, record)
  return Dispatched(save, evaluated, preempted and (not last or not lane.final))


def save_step(
  lane: Lane, step: int, state: TrainState, record: dict[str, Any], evaluated: bool
) -> None:
  """Writes ``step``'s metrics row (``record``, if any) and saves the step, and ``best/`` when
  the step was ``evaluated``."""
  run = lane.run
  if record:
    run.writer.write(step, record)
  run.writer.flush()
  save_checkpoint(run, step, state, lane.meta, lane.progress)
  if evaluated:
    save_start = time.perf_counter()
    run.checkpointer.save_best(step, state, lane.meta, lane.final)
    lane.progress.checkpoint(time.perf_counter() - save_start, waited=run.checkpointer.waited)


class StepEvaluation:
  """The evaluation of one step's state for each lane, run once (``run``, or the first lane's
  call): ``step_evaluation(k)`` is lane ``k``'s ``(metrics, seconds)``. Alone, the run's
  evaluation of its state; side by side, one evaluation of the seeds' stacked state (the lone
  ``eval_step`` vmapped, ``evaluation.make_eval_step(over_seeds=True)``: each test batch is read
  once for all seeds) split per seed, its seconds each seed's. The model's and, with an EMA, the
  EMA weights' metrics. An exception that stopped it (``EvaluationInterruptedError``: a stop
  request cut it short) is raised to each lane that asks."""

  def __init__(self, lanes: list[Lane], state: TrainState, eval_fn: Callable, preemption):
    self.lanes, self.state, self.eval_fn, self.preemption = lanes, state, eval_fn, preemption
    self.outcome: tuple[list[dict[str, Any]], float] | BaseException | None = None

  def run(self) -> None:
    """Evaluates now, unless done; keeps the metrics, or the exception that stopped it."""
    if self.outcome is not None:
      return
    run = self.lanes[0].run
    ema = self.state.ema_params if run.use_ema else None
    variables = (self.state.params, self.state.model_state)
    began = time.perf_counter()
    try:
      metrics = evaluation.evaluate_with_ema(
        self.eval_fn,
        variables,
        ema,
        run.eval_batches,
        run.batch_sharding,
        self.print_line,
        self.preemption.interrupts_evaluation,
      )
    except BaseException as e:  # each lane meets it when it asks for its metrics
      self.outcome = e
      return
    per_lane = [metrics]
    if len(self.lanes) > 1:
      per_lane = seeds_lib.split_metrics(metrics, len(self.lanes))
    self.outcome = per_lane, time.perf_counter() - began

  def print_line(self, line: str) -> None:
    """A progress line of a long evaluation, named by the runs it evaluates."""
    if len(self.lanes) == 1:
      self.lanes[0].progress.print_line(line)
    elif self.lanes[0].progress.enabled:
      print(f"{', '.join(lane.progress.name for lane in self.lanes)}: {line}", flush=True)

  def __call__(self, k: int) -> tuple[dict[str, Any], float]:
    self.run()
    if isinstance(self.outcome, BaseException):
      raise self.outcome
    per_lane, seconds = self.outcome
    return per_lane[k], seconds
