"""``configs.common.complete_config``: a config that lacks fields (an older run's config.json, a
hand-built config) gets the defaults, and a checkpoint recorded from one still resumes."""

import ml_collections

from configs.common import base_config, complete_config
from locvit.workdir import fingerprint


def _partial():
  c = ml_collections.ConfigDict()
  c.seed = 3
  c.model = ml_collections.ConfigDict({"name": "deit_tiny_patch2_32"})
  c.data = ml_collections.ConfigDict({"source": "digits", "image_size": 8})
  c.mixup = None
  c.init = ml_collections.ConfigDict({"name": "impulse", "solver": "fast"})
  c.optimizer = ml_collections.ConfigDict({"name": "adamw", "lr": 5e-4})
  return c


def test_missing_fields_take_the_defaults_and_set_values_stay():
  config = _partial()
  config.lock()
  out = complete_config(config)
  assert out.is_locked and "ema" not in config  # the caller's config is not changed
  assert (out.seed, out.data.image_size, out.optimizer.lr, out.init.solver) == (3, 8, 5e-4, "fast")
  assert out.mixup is None  # a block set to None stays None
  base = base_config()
  assert out.data.augment_on == base.data.augment_on and out.ema.to_dict() == base.ema.to_dict()
  assert out.optimizer.weight_decay == base.optimizer.weight_decay
  assert out.init.filter_size == 3 and out.init.cache_dir is None  # no cache unless given
  assert out.data.get_type("root") is str  # placeholders keep their types
  assert complete_config(base) == base


def test_a_checkpoint_recorded_from_a_partial_config_is_not_refused_or_reported_changed():
  old = _partial()
  # What an older version recorded: the fields its config had, None where it had none.
  derived = {"num_classes": 10, "ema.enabled": False}
  saved_config = {
    k: derived[k] if k in derived else fingerprint._get(old, k)
    for k in fingerprint.FINGERPRINT_FIELDS
  }
  saved_hyper = {k: fingerprint._get(old, k) for k in fingerprint.HYPERPARAMETER_FIELDS}
  assert saved_config["distillation.type"] is None and "b1" not in saved_hyper["optimizer"]
  config = complete_config(old)
  fingerprint.check_compatible(saved_config, config, "WORKDIR")
  changed = fingerprint.report_changed_hyperparameters(
    {"hyperparameters": saved_hyper}, config, "WORKDIR", 1
  )
  assert changed == []


def test_a_block_set_to_none_resumes_against_its_own_record():
  config = complete_config(_partial())
  config.distillation = None  # off, as the code has always accepted
  fingerprint.check_compatible(fingerprint.fingerprint(config, 10), config, "WORKDIR", 10)
