"""Everything a run needs, built once from a validated config, apart from the loop.

``build_training(config, workdir)`` checks the config (before anything is compiled or written),
claims the workdir, keeps the config, and builds the mesh and rules, the data sources and
iterators, the model, the optimizer, the state layout, the teacher, the checkpointer and the
metric writer. ``build_evaluation(config)`` checks the config the same way
(``checks.check_config``), then builds the part an evaluation needs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import optax
from absl import logging

from locvit import data as data_lib
from locvit import distill, optim
from locvit import metrics as metrics_lib
from locvit.convert import prior
from locvit.convert.pretrained import load_pretrained
from locvit.data import device_augment, resident
from locvit.init import from_checkpoint
from locvit.models.factory import build_model, check_attention_kernels, distillation_enabled
from locvit.platform import sharding
from locvit.run import checks, preemption
from locvit.run import state as state_lib
from locvit.workdir import checkpoint, lock, outage, paths, provenance


def training_length(config, num_train_examples: int) -> tuple[int, int]:
  """(total_steps, steps_per_epoch). Epochs scale by 1/train_fraction (ConViT Table 2)."""
  steps_per_epoch = max(num_train_examples // config.batch_size, 1)
  if config.total_steps > 0:
    return config.total_steps, steps_per_epoch
  epochs = config.num_epochs / config.data.train_fraction
  return max(math.ceil(epochs * steps_per_epoch), 1), steps_per_epoch


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """What evaluating a model needs: mesh and rules, the model, and the eval data."""

  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  rules: Any
  model: nn.Module
  num_classes: int
  image_shape: tuple[int, int, int]
  eval_source: Any
  eval_batches: Any

  @property
  def batch_sharding(self) -> jax.sharding.NamedSharding:
    """How a global batch is laid out: split over the mesh's data axis."""
    return sharding.batch_sharding(self.mesh, self.rules)


@dataclasses.dataclass(frozen=True)
class Training(Evaluation):
  """Everything a training run needs; ``with`` it to close the checkpointer and the writer and
  release the workdir when the run ends, however it ends. Built complete, never changed: each
  stage that adds parts (``open_workdir``, ``locvit.train.start_session``) returns a new run."""

  workdir: str = ""
  train_source: Any = None
  total_steps: int = 0
  steps_per_epoch: int = 0
  schedule: optax.Schedule | None = None
  tx: optax.GradientTransformation | None = None
  layout: state_lib.StateLayout | None = None
  teacher: distill.Teacher | None = None
  warmstart: Any = None
  checkpointer: checkpoint.Checkpointer | None = None
  writer: metrics_lib.MetricWriter | None = None
  hooks: dict[str, Callable | None] = dataclasses.field(default_factory=dict)
  train_split: Any = ()  # data.train_split_on='device': the decoded split, on every device
  started: float | None = None  # time.monotonic() as the build began: the session counts from it
  session: provenance.Session | None = None  # this session's entry of DIR/commits.json (process 0)
  # The deadline of a bucket workdir (process 0; None on a local disk), from the claim: passed to
  # the checkpointer, the writer and the session, the run's own, beside any other run's.
  watch: outage.Watch | None = None

  def train_batches(self, start_step: int):
    """This process's training batches for steps ``start_step + 1, ...``: the position depends
    on the global step alone, so a run resumes on another process or device count. With the
    training split on the device, each batch is its rows' indices into it."""
    position = dict(
      seed=self.config.seed,
      local_batch_size=self.config.batch_size // jax.process_count(),
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      start_step=start_step,
    )
    if self.train_split:
      return data_lib.make_index_iterator(self.config.data, len(self.train_source), **position)
    return data_lib.make_train_iterator(self.config.data, self.train_source, **position)

  @property
  def use_ema(self) -> bool:
    """Whether the run keeps a weight EMA (``config.ema.decay > 0``)."""
    return state_lib.ema_enabled(self.config)

  def __enter__(self) -> Training:
    return self

  def __exit__(self, exc_type, exc, _) -> None:
    # On a bucket, every close below runs under the run's one deadline (``watch``): a bucket that
    # does not answer ends the process once, not once per component.
    try:  # pending saves of earlier steps are committed even when a step or evaluation fails
      if self.checkpointer is not None:  # None: stopped while being built
        self.checkpointer.close()
    finally:
      try:
        if self.writer is not None:
          self.writer.close()
      except OSError:
        if exc_type is None:
          raise
        # The run already stops with its own error, often of the same cause (a full disk): that
        # one is reported; metrics.jsonl holds every row the TensorBoard file may have lost.
      finally:
        try:
          if self.session is not None:  # its wall time, the last save's commit included
            self.session.end()
        except Exception:  # a bucket client's error, of many types
          if exc is None:
            raise
          # The run already stops with its own error, often of the same cause (a full disk, a
          # bucket gone): that one is reported. The record keeps the last checkpoint's seconds
          # without ``ended``, which the report reads as a lower bound of the run's time.
        finally:
          try:
            lock.release_lock(self.workdir)
          except lock.WorkdirError as e:
            if exc is None:
              raise
            exc.add_note(str(e))  # reported after the run's own error, never instead of it


def _eval_batches(config, eval_source):
  eval_batch_size = config.eval_batch_size or config.batch_size
  return data_lib.make_eval_iterator(
    config.data,
    eval_source,
    local_batch_size=eval_batch_size // jax.process_count(),
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )


def _image_shape(config, source) -> tuple[int, int, int]:
  return (config.data.image_size, config.data.image_size, source[0]["image"].shape[-1])


def build_evaluation(config: ml_collections.ConfigDict) -> Evaluation:
  """The mesh, the model and the eval data of ``config``, validated first as a training run's is
  (``checks.check_config``: completed with the defaults of ``configs/common.py:base_config``), so
  a bad value is the same one error line before anything is built, not a failure inside JAX."""
  config = checks.check_config(config)  # the one check of the config's values
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  eval_source = data_lib.make_source(config.data, config.data.eval_split)
  num_classes = config.data.num_classes or eval_source.num_classes
  model = build_model(config, num_classes)
  checks.check_model_fits_mesh(config, mesh, rules, model)
  image_shape = _image_shape(config, eval_source)
  check_attention_kernels(model, image_shape, train=False)  # cuDNN's shapes, before compiling
  batches = _eval_batches(config, eval_source)
  return Evaluation(config, mesh, rules, model, num_classes, image_shape, eval_source, batches)


def weights_warmstart(config: ml_collections.ConfigDict, num_classes: int):
  """``config.init_from.weights`` fitted to the run's model (``locvit.convert.load_pretrained``):
  a fresh head for another class count (from the run's initialisation key), ``pos_embed``
  resampled to ``data.image_size``; each change logged in one line. Only the parameters are
  taken: the optimizer state, the step and the data position start fresh.

  With ``init_from.add_prior`` the weights are a plain DeiT's, read as ``model.name`` without the
  prior's overrides (``locvit.convert.prior.PRIOR_FIELDS``), and go into the run's model with
  its locality prior (``locvit.convert.prior``); one line says what was done and whether the
  start is the DeiT's function."""
  overrides = dict(config.model.overrides or {})
  if distillation_enabled(config):
    overrides["distilled"] = True
  add_prior = config.init_from.add_prior
  pretrained = load_pretrained(
    config.init_from.weights,
    model=config.model.name,
    num_classes=num_classes,
    img_size=config.data.image_size,
    seed=config.seed + 1,
    **(prior.source_overrides(overrides) if add_prior else overrides),
  )
  for note in pretrained.notes:
    logging.warning("init_from.weights: %s", note)
  if not add_prior:
    return from_checkpoint.Warmstart(pretrained.variables["params"], {}, 0)
  variables, report = prior.prior_from_pretrained(
    pretrained.variables,
    build_model(config, num_classes),
    image_size=config.data.image_size,
    seed=config.seed + 1,
    gate_logit=config.init_from.prior_gate,
  )
  logging.warning("init_from.add_prior: %s", report.summary())
  return from_checkpoint.Warmstart(variables["params"], {}, 0)


def checked_setup(config, hooks, started: float | None = None) -> Training:
  """Validates ``config`` (``checks.check_config``: completed with the defaults of
  ``configs/common.py:base_config``), then against its data and model, before the workdir is
  touched; the run without its workdir (its state's layout included: shapes only, nothing
  compiled). ``started``: ``time.monotonic()`` as the build began, the session's start."""
  config = checks.check_config(config)  # the one check of the config's values
  checks.check_analysis_hooks(config, **hooks)
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  train_source = data_lib.make_source(config.data, config.data.train_split)
  eval_source = data_lib.make_source(config.data, config.data.eval_split)
  data_lib.check_same_classes(train_source, eval_source)
  if train_source.num_classes < 2:  # one logit: the loss is 0 from the first step
    folders = config.data.source == "image_folder"
    classes = ", ".join(train_source.class_names) or "none"
    count = "one class" if train_source.num_classes == 1 else "no class"
    raise ValueError(
      f"{config.data.root if folders else config.data.name} has {count} in "
      f"{config.data.train_split!r} ({classes}): a classifier needs at least 2"
      + (", one folder per class: ROOT/<split>/<class_name>/*.jpg" if folders else "")
    )
  num_classes = config.data.num_classes or train_source.num_classes
  if num_classes > train_source.num_classes and config.data.source == "image_folder":
    logging.warning(  # a paper config on the user's own folder keeps the paper's class count
      "data.num_classes=%d, but %s has %d classes in %r: the head's other %d outputs are never a "
      "label, and top-5 ranks them too; --config.data.num_classes=%d fits the head to the folder",
      num_classes,
      config.data.root,
      train_source.num_classes,
      config.data.train_split,
      num_classes - train_source.num_classes,
      train_source.num_classes,
    )
  if config.data.num_classes is None and config.mixup is not None:  # known only now
    device_augment.validate_mixup_config(config.mixup, num_classes)
  image_shape = _image_shape(config, train_source)
  warmstart = None
  if from_checkpoint.enabled(config):  # e.g. a pruned model (Cordonnier et al., appendix E)
    config = ml_collections.ConfigDict(config.to_dict())  # don't edit the caller's config
    warmstart = from_checkpoint.load(config, num_classes, image_shape)
    from_checkpoint.apply_layer_heads(config, warmstart)
  elif config.init_from is not None and config.init_from.get("weights"):
    warmstart = weights_warmstart(config, num_classes)
  model = build_model(config, num_classes)
  checks.check_model_fits_mesh(config, mesh, rules, model)
  check_attention_kernels(model, image_shape)  # cuDNN's shapes, before the workdir and compiling
  if len(train_source) < config.batch_size:  # refused before the workdir is created
    folder = config.data.source == "image_folder"
    raise ValueError(
      f"batch_size={config.batch_size} is larger than the {len(train_source)} training examples "
      f"of {config.data.root if folder else config.data.name} ({config.data.train_split!r}): a "
      f"step needs a whole batch; use --config.batch_size of at most {len(train_source)}, or "
      "more data."
    )
  total_steps, steps_per_epoch = training_length(config, len(train_source))
  boxed_params, _ = sharding.model_variable_shapes(model, image_shape)  # abstract, no compute
  schedule = optim.make_schedule(config, total_steps, steps_per_epoch)
  # config.freeze's patterns are matched against the parameters here, before the workdir.
  tx = optim.make_optimizer(config, nn.meta.unbox(boxed_params), schedule)
  train_split = ()
  if config.data.train_split_on == "device":  # decoded before the workdir: its errors first
    load_start = time.perf_counter()
    split = resident.load_train_split(config.data, train_source)
    train_split = resident.on_device(split, sharding.replicated(mesh))
    logging.info(
      "The training split is on the device: %d images, %.1f MB, decoded in %.1f s.",
      len(train_source),
      split["image"].nbytes / 1e6,
      time.perf_counter() - load_start,
    )
  ema = state_lib.ema_enabled(config)
  return Training(
    config,
    mesh,
    rules,
    model,
    num_classes,
    image_shape,
    eval_source,
    eval_batches=None,  # made per workdir (open_workdir)
    train_source=train_source,
    total_steps=total_steps,
    steps_per_epoch=steps_per_epoch,
    schedule=schedule,
    tx=tx,
    layout=state_lib.state_layout(model, image_shape, tx, mesh, rules, ema=ema),
    warmstart=warmstart,
    hooks=hooks,
    train_split=train_split,
    started=started,
  )


@preemption.defer_stops_in
def _claim(workdir: str, bucket_timeout: float) -> outage.Watch | None:
  """``lock.claim`` as one piece: a stop that arrives while the lock is being taken is sent
  again once it is (and the run's exit releases it), instead of leaving a lock file no one holds."""
  return lock.claim(workdir, bucket_timeout)


def build_training(
  config: ml_collections.ConfigDict, workdir: str, **hooks: Callable | None
) -> Training:
  """Validates ``config``, then claims ``workdir``, keeps the config and builds the run.

  ``hooks``: ``make_locality_logger`` and ``make_center_plotter`` (see ``train_and_evaluate``).
  """
  started = time.monotonic()
  return open_workdir(checked_setup(config, hooks, started), workdir)


def open_workdir(run: Training, workdir: str) -> Training:
  """``run`` (checked by ``checked_setup``) in ``workdir``, as a new run: claims it, then adds
  what writes there or reads per run (eval batches, the teacher unless ``run`` has it,
  checkpointer, writer). A failure or a stop on the way closes what was opened and releases the
  workdir, as the run's exit would."""
  config = run.config
  watch = checkpointer = writer = None

  def opened(**parts) -> Training:
    return dataclasses.replace(
      run, workdir=workdir, watch=watch, checkpointer=checkpointer, writer=writer, **parts
    )

  try:  # an error or a stop (SIGTERM, Ctrl-C) from here on releases the workdir, as the run would
    # The config is valid: only now create the workdir (writable, not in use). The config is kept
    # (config.json) once the workdir's checkpoint has accepted it (train.restore_or_initialise).
    watch = _claim(workdir, config.bucket_timeout_seconds)
    eval_batches = _eval_batches(config, run.eval_source)
    teacher = run.teacher
    if distill.enabled(config) and teacher is None:
      teacher = distill.load_teacher(config, run.num_classes, run.image_shape, run.mesh, run.rules)
    checkpointer = checkpoint.Checkpointer(
      paths.path(workdir) / "checkpoints",
      keep=config.keep_checkpoints,
      async_save=config.async_checkpointing,
      watch=watch,
    )
    writer = metrics_lib.MetricWriter(workdir, watch=watch)
  except BaseException as e:
    opened().__exit__(type(e), e, e.__traceback__)
    raise
  return opened(eval_batches=eval_batches, teacher=teacher)
