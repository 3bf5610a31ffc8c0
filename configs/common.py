"""The base config every experiment starts from, and small helpers shared by configs.

The sub-config blocks (``data``, ``init``, ``mixup``, ...) are the defaults of
``configs/defaults.py``, where their fields are documented.

Fields (all overridable on the command line, e.g. ``--config.batch_size=256``):
  seed, num_seeds (seeds side by side), batch_size (global), eval_batch_size, num_epochs,
  total_steps (> 0 overrides epochs),
  model.name / model.overrides, data.* (see ``defaults.data_config``),
  optimizer.*, schedule.*, grad_clip_norm, grad_accum_steps, steps_per_dispatch, label_smoothing,
  freeze (regexes),
  mixed_precision (bf16 compute, fp32 params), mesh.shape / mesh.layout / mesh.rules,
  mixup.* and random_erasing.* (on-device batch augmentation, ``locvit.data.device_augment``),
  ema.decay / ema.warmup (weight EMA, evaluated beside the model), distillation.* (DeiT-style
  teacher, ``locvit.distill``), init_from.* (start from another run's parameters, optionally
  pruned, ``locvit.init.from_checkpoint``), log_every_steps, eval_every_steps,
  checkpoint_every_steps, keep_checkpoints, bucket_timeout_seconds, nonfinite ('stop' | 'skip').

Training recipes (DeiT, the small-dataset recipes of the papers) are presets in
``configs/recipes.py`` that set these fields.
"""

from __future__ import annotations

import ml_collections

from locvit.configs import datasets, defaults


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # N > 1 trains the seeds seed, seed + 1, ..., seed + N - 1 side by side in one jitted step, each
  # a run of its own in WORKDIR/seed<K>/ (locvit.run.seeds).
  c.num_seeds = 1
  c.batch_size = 128
  c.eval_batch_size = 0  # 0: same as batch_size
  c.num_epochs = 100.0
  c.total_steps = -1  # > 0 overrides num_epochs

  c.model = ml_collections.ConfigDict()
  c.model.name = "deit_tiny_patch4_32"
  # Module fields to override, e.g. depth=6. `--config.model.overrides.FIELD=VALUE` sets any field
  # of the model, whether a config sets it or not (locvit.main adds the ones it does not).
  c.model.overrides = ml_collections.ConfigDict()
  # The attention kernels, a hardware choice kept out of the model's identity (resuming with
  # another value is allowed): None (CPU code paths on CPU, JAX's choice elsewhere), 'xla',
  # 'cudnn' or 'cpu_kernels' (locvit.platform.ops; 'einsum' is accepted as its alias).
  c.attention_implementation = ml_collections.config_dict.placeholder(str)
  # XLA options for the training step's compilation, one setting (locvit.platform.xla_options):
  # 'none' (XLA's defaults), 'gpu_tuned', 'gpu_graphs' or 'auto' ('gpu_tuned' on a GPU). Hardware
  # only, like the above.
  c.xla_options = "none"

  c.data = defaults.data_config()
  c.optimizer = defaults.optimizer_config()
  c.schedule = defaults.schedule_config()
  # Attention initialisation applied after model.init (locvit.init): 'none', 'trunc_normal',
  # 'kaiming_uniform', 'mimetic' or 'impulse' (structured initialization).
  c.init = defaults.init_config("none")
  # Or start from another run's parameters (fine-tuning; pruned heads, Cordonnier appendix E).
  c.init_from = defaults.init_from_config()

  c.grad_clip_norm = 0.0  # 0: off
  c.grad_accum_steps = 1
  # Optimizer steps per host dispatch (one lax.scan over that many batches already on the device);
  # log, save and evaluation steps still happen exactly (locvit.run.cadence.dispatch_end).
  c.steps_per_dispatch = 1
  c.label_smoothing = 0.0
  c.freeze = ()  # regexes on '/'-joined param paths, e.g. ('gating_param',)
  c.mixed_precision = False

  # On-device batch augmentation (off by default): random erasing, then Mixup/CutMix.
  c.mixup = defaults.mixup_config()
  c.random_erasing = defaults.erasing_config()
  # Weight EMA: decay > 0 keeps and evaluates an exponential moving average of the parameters.
  c.ema = ml_collections.ConfigDict({"decay": 0.0, "warmup": False})
  # DeiT-style distillation from a teacher run's checkpoint (ConViT appendix B, Table 4).
  c.distillation = defaults.distillation_config()
  c.mesh = defaults.mesh_config()

  # Analysis logged during training (locvit.analysis.locality): nonlocality, gates, centres.
  c.analysis = defaults.analysis_config()
  _fill_logging_and_checkpointing(c)
  return c


def _fill_logging_and_checkpointing(c: ml_collections.ConfigDict) -> None:
  """Sets ``c``'s cadences (log, evaluation, checkpoint), checkpoint keeping and failure fields."""
  c.log_every_steps = 50
  c.eval_every_steps = 0  # 0: only at the end
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 3
  c.async_checkpointing = True
  # A workdir in a bucket (gs://, s3://) that does not answer for this long ends the run: exit 2,
  # one line naming the bucket, what was being written and the steps committed. Shorter outages
  # are ridden out. The run's lease outlives it, so no other run can take the workdir meanwhile.
  c.bucket_timeout_seconds = 60.0
  # A non-finite loss or gradient norm: 'stop' (error naming the step; no checkpoint is written
  # after it) or 'skip' (the update is dropped and counted in train/skipped_steps).
  c.nonfinite = "stop"


def complete_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` with every field of ``base_config()`` it lacks set to its default.

  Sub-configs present in both are completed field by field (``init`` from
  ``defaults.init_config(config.init.name)``); a block the config sets to None stays None, and no
  value the config sets changes. Library entry points call this once, so library code reads
  fields directly; configs written by older versions (a ``config.json`` without newer fields)
  get the defaults, which keep every optional block (mixup, EMA, distillation, ...) off.
  """
  return defaults.with_defaults(config, base_config())


def cifar10_image_folder(c: ml_collections.ConfigDict, train_fraction: float = 1.0) -> None:
  """Points ``c.data`` at the CIFAR-10 image-folder copy in ``$CIFAR10_ROOT`` (train / test splits),
  keeping the first ``train_fraction`` of each class (the reduced-scale runs of docs/results.md)."""
  datasets.use_dataset(c, "cifar10", source="image_folder")
  c.data.train_fraction = train_fraction
