"""Every check of a run's config, before anything is created: ``config_errors`` (what shows
without data or a model, every mistake a line each), raised once by ``check_config`` (called
before anything is built by each entry point that builds from a config: ``build_training`` and
``build_evaluation`` in ``locvit.run.bundle`` (every evaluation builds through it),
``predict_weights``, and ``locvit.main`` for ``--mode=analyze`` (built in ``locvit.analysis``, a
layer below) and ``--print_config``),
``check_recipe`` (the augmentation, EMA and distillation blocks), ``check_analysis_hooks`` and
``check_model_fits_mesh`` (the image against the model's patches, the batches against the mesh),
run once the data and the model are known, before compiling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from locvit import data as data_lib
from locvit import distill, optim
from locvit.analysis.locality import MODES as LOCALITY_MODES
from locvit.choices import Errors, check_choice
from locvit.configs.common import complete_config
from locvit.data import device_augment
from locvit.init import check_init_config
from locvit.models.layers import check_patchable
from locvit.models.registry import check_overrides, default_image_size
from locvit.platform import ops, sharding, xla_options
from locvit.run.step import NONFINITE_MODES

# Fields that must be positive where the config has them. Model overrides that size the network:
# zero would otherwise fail deep inside Flax (depth=0: NameInUseError).
_POSITIVE = (
  "batch_size",
  "grad_accum_steps",
  "steps_per_dispatch",
  "log_every_steps",
  "num_seeds",  # seeds side by side (locvit.run.seeds)
)
_NON_NEGATIVE = ("eval_batch_size", "eval_every_steps", "checkpoint_every_steps")
_POSITIVE_MODEL = ("depth", "num_heads", "embed_dim", "patch_size", "mlp_ratio", "num_layers")


def config_errors(config: ml_collections.ConfigDict) -> list[str]:
  """Every mistake in ``config`` that shows without reading data or building anything, a line
  each: the run's numbers, the model name, the data, recipe, optimizer and schedule blocks.
  ``check_config`` raises them all at once."""
  config = complete_config(config)
  errors = Errors()
  checks = [(name, config[name], "a positive integer", 1) for name in _POSITIVE]
  checks += [(name, config[name], "an integer >= 0", 0) for name in _NON_NEGATIVE]
  overrides = config.model.overrides or {}
  checks += [
    (f"model.overrides.{name}", overrides[name], "> 0", 1e-30)
    for name in _POSITIVE_MODEL
    if name in overrides
  ]
  for name, value, expected, lowest in checks:
    if isinstance(value, int | float) and value < lowest:
      errors.add(f"--config.{name}={value}: must be {expected}")
  timeout = config.bucket_timeout_seconds
  if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 1 <= timeout <= 3600:
    errors.add(
      f"--config.bucket_timeout_seconds={timeout}: must be a number of seconds in [1, 3600] "
      "(how long a bucket workdir may not answer before the run ends)"
    )
  if config.total_steps <= 0 and config.num_epochs <= 0:
    errors.add(
      f"--config.num_epochs={config.num_epochs}: must be > 0 (or set --config.total_steps)"
    )
  errors.check(default_image_size, config.model.name)  # an unknown name, with close matches
  errors.check(check_overrides, config.model.name, overrides)
  if "num_classes" in overrides:  # create_model's own argument, from the data
    errors.add(
      "model.overrides.num_classes: the class count is the data's; set it with "
      "--config.data.num_classes"
    )
  errors.check(data_lib.validate_data_config, config.data)
  known = config.data.num_classes is not None  # else the data source tells, once it is read
  errors.check(check_recipe, config, config.data.num_classes, check_classes=known)
  errors.check(optim.check_optimizer_config, config)
  errors.check(check_choice, "--config.xla_options", config.xla_options, xla_options.CHOICES)
  errors.check(
    check_choice,
    "--config.attention_implementation",
    config.attention_implementation,
    ops.IMPLEMENTATIONS,
  )
  errors.check(check_choice, "mesh.layout", config.mesh.layout, sorted(sharding.LAYOUTS))
  if config.init is not None:
    errors.check(check_init_config, config.init)
  init_from = config.init_from
  if init_from is not None and init_from.add_prior and not init_from.weights:
    errors.add(
      "init_from.add_prior=True adds a locality prior to pretrained weights: give "
      "init_from.weights of a plain DeiT (e.g. deit_tiny_patch16_224.fb_in1k)"
    )
  if init_from is not None and init_from.workdir and init_from.get("weights"):
    errors.add(
      f"init_from.workdir={init_from.workdir!r} and init_from.weights={init_from.weights!r}: a run "
      "starts from one of them; unset the other"
    )
  if config.analysis is not None and config.analysis.locality:
    mode = config.analysis.locality_mode
    errors.check(check_choice, "analysis.locality_mode", mode, LOCALITY_MODES)
  return errors.messages


def check_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` completed with the defaults of ``configs/common.py:base_config``; raises
  ``ValueError`` listing every ``config_errors`` line (under a count when there are several)."""
  config = complete_config(config)
  errors = config_errors(config)
  if len(errors) == 1:
    raise ValueError(errors[0])
  if errors:
    raise ValueError(f"{len(errors)} errors in the config:\n  " + "\n  ".join(errors))
  return config


def check_recipe(
  config: ml_collections.ConfigDict, num_classes: Any, *, check_classes: bool = True
) -> None:
  """Checks the on-device augmentation, EMA and distillation blocks (every error, a line each);
  runs before compiling. ``check_classes=False``: the class count is not known yet."""
  errors = Errors()
  if config.mixup is not None:
    errors.check(
      device_augment.validate_mixup_config, config.mixup, num_classes, check_classes=check_classes
    )
  if config.random_erasing is not None:
    errors.check(device_augment.validate_erasing_config, config.random_erasing)
  if config.nonfinite not in NONFINITE_MODES:
    errors.add(f"nonfinite={config.nonfinite!r} is not one of {list(NONFINITE_MODES)}")
  if config.ema is not None and not 0 <= config.ema.decay < 1:
    errors.add(f"ema.decay={config.ema.decay!r} must be in [0, 1) (0 turns the EMA off)")
  errors.check(distill.check_distillation_config, config)
  errors.raise_all()


def check_analysis_hooks(config: ml_collections.ConfigDict, **hooks: Callable | None) -> None:
  """``config.analysis`` switches on per-evaluation analysis only the caller's hooks can do."""
  fields = {"locality": "make_locality_logger", "center_plots": "make_center_plotter"}
  for field, hook in fields.items():
    if config.analysis is not None and config.analysis[field] and hooks[hook] is None:
      raise ValueError(
        f"config.analysis.{field}=True, but train_and_evaluate got no {hook}: pass "
        f"**locvit.analysis.hooks.training_hooks() (as locvit.main does) or turn it off."
      )


def check_model_fits_mesh(config: ml_collections.ConfigDict, mesh, rules, model: nn.Module) -> None:
  """The image against the model's patches and the batch sizes (and micro-batches) against the
  mesh's data-parallel devices and the processes: checks that would otherwise fail deep inside
  JAX; runs before anything is compiled."""
  image_size = config.data.image_size
  if hasattr(model, "patch_size"):
    check_patchable(image_size, image_size, model.patch_size)
  dp = sharding.data_parallel_size(mesh, rules)
  for name in ("batch_size", "eval_batch_size"):
    size = config[name] or config.batch_size
    if size % dp:
      below = size // dp  # the two nearest valid sizes under it and the two over it
      valid = [dp * k for k in range(below - 1, below + 3) if k > 0]
      raise ValueError(
        f"{name}={size} is not divisible by the {dp} data-parallel devices of mesh "
        f"{dict(mesh.shape)}. Valid values near it: {valid}."
      )
    if size % jax.process_count():
      raise ValueError(f"{name}={size} is not divisible by {jax.process_count()} processes.")
  accum = config.grad_accum_steps
  if accum < 1 or config.batch_size % (accum * dp):
    raise ValueError(
      f"grad_accum_steps={accum}: batch_size={config.batch_size} must split into {accum} "
      f"micro-batches each divisible by {dp} data-parallel devices."
    )
