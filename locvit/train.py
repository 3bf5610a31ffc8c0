"""The training loop, readable top to bottom.

    build the run (``locvit.run.bundle``: mesh, data, model, optimizer, state layout, teacher,
    checkpointer, writer) -> resume from the workdir (or initialise) -> loop: step, log, save,
    evaluate, analysis hooks, preemption.

The step itself (augmentation, distillation, gradient accumulation, EMA, non-finite guard) is
``locvit.run.step``; the state and its shardings ``locvit.run.state``.

Determinism: the dropout key of step ``s`` is ``fold_in(key(seed), s)``, the augmentation key
``fold_in(key(seed + 2), s)``, and the data position is a function of the global step, so a run
stopped by SIGTERM and resumed reproduces the uninterrupted run (bitwise on CPU), and resumes on
another process or device count too (same data order; the loss agrees to reduction-order rounding,
docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
from absl import logging

from locvit import metrics as metrics_lib
from locvit.data import device_augment
from locvit.platform import sharding, xla_options
from locvit.run import bundle, evaluation
from locvit.run.cadence import RunAhead, dispatch_end, is_evaluation_step, is_log_step, is_save_step
from locvit.run.preemption import EvaluationInterruptedError, PreemptionWatcher
from locvit.run.state import TrainState, apply_initializer
from locvit.run.step import (
  all_finite,
  check_finite_state,
  check_health,
  guarded_steps,
  initial_health,
)
from locvit.workdir import checkpoint, fingerprint, lock, provenance, saved_config

# ------------------------------------------------------------------------------------------------
# Loop helpers, in the order the loop calls them


def restore_or_initialise(run: bundle.Training) -> tuple[int, TrainState]:
  """``(start step, state)``: the newest intact checkpoint of the workdir, else a fresh state
  (``config.init`` or ``init_from`` applied); the commit that trains on from there is appended to
  ``DIR/commits.json`` (``locvit.workdir.provenance``: this session's entry, ``run.session``, which
  then records each checkpoint's step and the session's wall time). Runs inside the run's mesh."""
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
  if jax.process_index() == 0 and start < run.total_steps:  # which commit trains from here
    run.session = provenance.record_start(run.workdir, start + 1, run.started)
    run.checkpointer.on_saved(run.session.checkpointed)  # a killed run keeps its last save's time
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  logging.info(
    "%s: %.2fM parameters; %d steps", config.model.name, num_params / 1e6, run.total_steps
  )
  return start, state


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


def make_step_fn(run: bundle.Training) -> Callable:
  """The jitted, donating ``guarded_steps(state, batches, teacher_variables, health)``: one
  optimizer step per batch of the list ``batches``, in one dispatch, compiled with the XLA options
  of ``config.xla_options``; the training split on the device, if any, is passed to each call."""
  replicated, shardings = sharding.replicated(run.mesh), run.layout.shardings
  step = functools.partial(
    guarded_steps,
    model=run.model,
    tx=run.tx,
    schedule=run.schedule,
    config=run.config,
    num_classes=run.num_classes,
    teacher=run.teacher,
  )
  options = xla_options.compiler_options(run.config.xla_options, jax.default_backend())
  jitted = jax.jit(
    step,
    in_shardings=(
      shardings,
      run.batch_sharding,
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

  def __call__(self, step: int, params) -> dict[str, Any]:
    record = self.locality_fn(params) if self.locality_fn is not None else {}
    self.plot_centers(step, params)
    return record


class HealthMonitor:
  """Reads the on-device non-finite record at log and save steps (``check_health``)."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config, self.warned = config, 0

  def check(self, health, step: int) -> None:
    """Stops (or warns about skipped updates) per ``config.nonfinite`` at ``step``."""
    self.warned = check_health(self.config, jax.device_get(health), step, self.warned)


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


def evaluate_unevaluated_step(
  run, step: int, state, evaluate, analysis, progress, meta
) -> dict[str, Any]:
  """The evaluation of the resumed ``step`` (an evaluation step) when the run that saved it
  logged none: it was stopped during the evaluation (or the evaluation failed). Evaluates now
  and rewrites the step's row with it, and saves ``best/``, as the uninterrupted run would have:
  each step is logged once, with its evaluation. ``{}`` when the step's row has its evaluation."""
  rows = [row for row in metrics_lib.read_metrics(run.workdir) if row["step"] == step]
  if rows and "eval/top1" in rows[-1]:
    return {}
  logging.info("Step %d was saved without its evaluation; evaluating it now.", step)
  eval_start = time.perf_counter()
  final = evaluate()
  record = {key: value for key, value in (rows[-1] if rows else {}).items() if key != "step"}
  record.update(final)
  record.update(analysis(step, state.params))
  record.update(progress.evaluation(step, final, time.perf_counter() - eval_start))
  run.writer.truncate_after(step - 1)
  run.writer.write(step, record)
  run.writer.flush()
  run.checkpointer.save_best(step, state, meta, final)
  return final


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

  Returns the final evaluation metrics (plus ``preempted=True`` if stopped by SIGTERM).
  """
  hooks = dict(make_locality_logger=make_locality_logger, make_center_plotter=make_center_plotter)
  with bundle.build_training(config, workdir, **hooks) as run:
    if on_setup is not None:
      on_setup()
    run.checkpointer.check_best()
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
      start, state = restore_or_initialise(run)
      return train_loop(run, start, state)


def train_loop(run: bundle.Training, start: int, state: TrainState) -> dict[str, Any]:
  """Steps ``start + 1 .. total_steps``: train, log, save, evaluate, analyse, stop if preempted.
  Each pass runs the steps of one dispatch (``dispatch_end``) and acts on its last step."""
  config, total_steps, writer = run.config, run.total_steps, run.writer
  step_fn = make_step_fn(run)
  health = jax.device_put(initial_health(), sharding.replicated(run.mesh))
  teacher_variables = run.teacher.variables if run.teacher else ()
  eval_fn = evaluation.make_eval_step(
    run.model,
    run.mesh,
    run.rules,
    (run.layout.shardings.params, run.layout.shardings.model_state),
    functools.partial(device_augment.normalize, data_config=config.data),
  )
  analysis = AnalysisHooks(run, state, start)
  progress = metrics_lib.Progress(total_steps, config.batch_size, start)
  final = {}
  monitor = HealthMonitor(config)
  meta = fingerprint.checkpoint_meta(config, run.num_classes)
  watcher = PreemptionWatcher(multiprocess=jax.process_count() > 1, checkpointer=run.checkpointer)
  run_ahead = RunAhead()
  # closing: stops grain's worker processes (data.num_workers) however the loop ends.
  with watcher as preemption, contextlib.closing(run.train_batches(start)) as train_batches:
    if start and is_evaluation_step(config, start, total_steps):
      evaluate = lambda: _evaluate(run, state, eval_fn, progress, preemption)
      try:
        final = evaluate_unevaluated_step(run, start, state, evaluate, analysis, progress, meta)
      except EvaluationInterruptedError as e:
        logging.warning("Stop requested while evaluating step %d: %s; exiting.", start, e)
        return {"preempted": True, "step": start}
    if start >= total_steps:
      final = final or metrics_lib.last_evaluation(run.workdir)
      progress.finished(run.workdir, final)
    step = start
    while step < total_steps:
      first, step = step + 1, dispatch_end(config, step, start, total_steps)
      local = [next(train_batches) for _ in range(first, step + 1)]
      batches = [sharding.global_batch(b, run.batch_sharding) for b in local]
      run_ahead.wait()
      state, train_metrics, health = step_fn(state, batches, teacher_variables, health)
      run_ahead.dispatched(train_metrics)
      last = step == total_steps
      # Every step is asked (processes agree on a preemption step); the dispatch's last one stops.
      preempted = any([preemption.should_stop(s) for s in range(first, step + 1)])

      run.checkpointer.check_for_errors(step)  # an async save that failed stops the run here
      record = {}
      on_grid = is_log_step(config, step, total_steps)
      if on_grid or step == start + 1:  # a resumed run's first step: a progress line only
        monitor.check(health, step)
        lock.check_lock(run.workdir)
        train_row = log_train_metrics(run, step, train_metrics, progress)
        # The rows of an uninterrupted run: a point one step after the resume would draw the
        # noise of a single batch as a jump in the loss curve.
        record.update(train_row if on_grid else {})
      save = is_save_step(config, step, total_steps) or preempted
      if save:
        monitor.check(health, step)
      # A step's metrics row is durable before the checkpoint that covers it: a resumed run starts
      # at a checkpoint and logs every later step again, so each step is logged exactly once.
      if is_evaluation_step(config, step, total_steps):
        eval_start = time.perf_counter()
        try:
          final = _evaluate(run, state, eval_fn, progress, preemption)
          record.update(final)
          record.update(analysis(step, state.params))
          record.update(progress.evaluation(step, final, time.perf_counter() - eval_start))
        except EvaluationInterruptedError as e:  # within the grace period: save now, without it
          logging.warning(
            "Stop requested at step %d: %s; saving the step without it (the resumed run "
            "evaluates it).",
            step,
            e,
          )
          final, save, preempted = {}, True, True
        except BaseException:  # a failing evaluation loses no training: keep the step and its row
          if save:
            writer.write(step, record)
            writer.flush()
            save_checkpoint(run, step, state, meta, progress)
          raise
      if record:
        writer.write(step, record)
      if save:
        writer.flush()
        save_checkpoint(run, step, state, meta, progress)
        if "eval/top1" in record:  # evaluated at this step
          save_start = time.perf_counter()
          run.checkpointer.save_best(step, state, meta, final)
          progress.checkpoint(time.perf_counter() - save_start, waited=run.checkpointer.waited)
      if preempted and (not last or not final):
        run.checkpointer.wait()
        logging.warning("Preempted: checkpoint saved at step %d; exiting.", step)
        final = {"preempted": True, "step": step}
        break
  return final


def _evaluate(run, state, eval_fn, progress, preemption) -> dict[str, float]:
  """The model's (and the EMA's) evaluation metrics; EvaluationInterruptedError when a stop
  request cuts the evaluation short."""
  ema = state.ema_params if run.use_ema else None
  variables = (state.params, state.model_state)
  interrupt = preemption.interrupts_evaluation
  return evaluation.evaluate_with_ema(
    eval_fn, variables, ema, run.eval_batches, run.batch_sharding, progress.print_line, interrupt
  )
