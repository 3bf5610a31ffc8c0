"""The default sub-configs and the constants shipped configs use, as plain data.

Configs import only the standard library, ``ml_collections`` and ``locvit.configs`` modules, so
loading one does not import JAX (``tests/test_layering.py``). The library modules that consume
these blocks re-export them under their public names (``locvit.data.default_data_config``,
``locvit.init.init_config``, ``locvit.models.convit_overrides``, ...) and keep the validation.
"""

from __future__ import annotations

import copy
from typing import Any

import ml_collections

# ------------------------------------------------------------------------------------------------
# Data (locvit.data)

# ImageNet statistics in [0, 1] units, the usual default for ViT/DeiT/ConViT recipes.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)


def data_config() -> ml_collections.ConfigDict:
  """Returns the default data config (the offline 8x8 digits quickstart, no augmentation).

  CIFAR/ImageNet configs set `source`, `name`/`root`, `image_size`, `train_augment` ('crop_flip'
  or 'rrc_flip') and usually `mean`/`std`.

  Fields:
    source: 'digits' | 'tfds' | 'image_folder'.
    name: TFDS dataset name, used when source == 'tfds'.
    data_dir: TFDS data_dir (None -> TFDS default, ~/tensorflow_datasets or $TFDS_DATA_DIR).
    root: image-folder root laid out as ROOT/{train,test}/<class>/*.{jpg,jpeg,png}.
    train_split, eval_split: split names (TFDS split strings are passed through).
    image_size: final square side fed to the model.
    num_classes: None -> taken from the source.
    train_fraction: keep the first int(n_c * f) train examples of each class (>= 1).
    class_limit: None, or k >= 1: keep only examples with label < k in every split (e.g. the
      first 100 ImageNet classes of ConViT Table 3); the source then has k classes.
    on_corrupt: 'error' | 'skip' for unreadable image files.
    train_augment: a recipe name registered in `locvit.data.augment` ('none', 'crop_flip',
      'rrc_flip', ...).
    auto_augment: None, or a RandAugment / AutoAugment string applied to training images after
      the recipe's ops: 'rand-m9-mstd0.5-inc1' (timm RandAugment), 'autoaug-cifar10',
      'autoaug-svhn', 'autoaug-imagenet' (paper policies, torchvision bins), 'original', 'v0'
      (timm's ImageNet policies); see `locvit.data.autoaugment`.
    auto_augment_fill: None (fill geometric auto_augment ops with round(255 * mean), as timm) or
      an int 0..255 used on every channel (128: timm's op default and the GMM code's).
    repeated_augmentations: k >= 1. Each epoch takes the first ceil(n / k) examples of its
      permutation, each k times with different augmentations; the epoch keeps n examples (DeiT's
      RASampler). 1: off.
    crop_padding, rrc_scale, rrc_ratio, interpolation: augmentation parameters (interpolation is
      also the resampling of auto_augment's geometric ops).
    eval_crop_pct: eval resizes the shorter side to image_size / eval_crop_pct, then centre-crops.
    mean, std: per-channel normalisation in [0, 1] units. A 3-tuple applied to 1-channel images
      is averaged to one value.
    augment_on: 'host' | 'device'. 'device' moves the trailing run of random-resized crop,
      pad-crop, flip and auto_augment (RandAugment / AutoAugment,
      ``locvit.data.device_autoaugment``) into the jitted train step
      (``locvit.data.device_augment``, per-example draws from the step's key); the host keeps
      the ops before them and the decode. A random-resized crop keeps its box draw and cut on
      the host (the same boxes as 'host'; with data.train_split_on='device' the step draws
      them) and resizes on the device, equal to Pillow's bit for
      bit (``locvit.data.resample``). The device auto_augment ops agree with Pillow's within one
      grey level per pixel; its random stream differs from the host's, its distributions do
      not. 'host' runs every op on the host, timm's exact code path.
    rrc_canvas: side in pixels of the square a device random-resized crop's box travels on
      (None: 2 * image_size). A box larger than it is resized on the host instead.
    train_split_on: 'host' | 'device'. 'device' keeps the decoded training split in accelerator
      memory (replicated on every device, loaded once at start-up with every core decoding) and
      sends each step only its rows' indices: the step gathers its batch, so no host work or
      transfer paces a small-data step (``locvit.data.resident``). Needs a split that fits
      data.decoded_cache_mb and a recipe whose host ops draw nothing (set data.augment_on=
      'device' for the crops, flip and auto_augment). The batches are the host pipeline's, row
      for row, so a run is the same either way (bitwise on CPU) and resumes across the setting;
      except that a random-resized crop's box is then drawn in the step (the same distribution,
      another random stream).
      With several processes each one decodes and holds the whole split and sends its share of
      each step's indices.
    decoded_cache_mb: memory budget (MB per process) for keeping a split's decoded images
      (``locvit.data.decoded``); a larger split keeps streaming. 0: always stream.
    num_threads: threads decoding/augmenting batches (grain ReadOptions.num_threads).
    num_workers: processes building training batches (grain ``mp_prefetch``), each with
      num_threads threads; 0 builds them in this process. Threads share the interpreter lock,
      so a host feeding a GPU from JPEGs at 224 needs processes. The decoded cache is then
      per worker.
    prefetch: number of batches buffered ahead (grain ReadOptions.prefetch_buffer_size).
  """
  c = ml_collections.ConfigDict()
  c.source = "digits"
  c.name = "cifar10"
  # Typed placeholders (None by default) so `--config.data.root=DIR` works on the command line.
  c.data_dir = ml_collections.config_dict.placeholder(str)
  c.root = ml_collections.config_dict.placeholder(str)
  c.train_split = "train"
  c.eval_split = "test"
  c.image_size = 8
  c.num_classes = ml_collections.config_dict.placeholder(int)
  c.train_fraction = 1.0
  c.class_limit = ml_collections.config_dict.placeholder(int)
  c.on_corrupt = "error"
  c.train_augment = "none"
  c.auto_augment = ml_collections.config_dict.placeholder(str)
  c.auto_augment_fill = ml_collections.config_dict.placeholder(int)
  c.repeated_augmentations = 1
  c.crop_padding = 4
  c.rrc_scale = (0.08, 1.0)
  c.rrc_ratio = (3.0 / 4.0, 4.0 / 3.0)
  c.interpolation = "bicubic"
  c.eval_crop_pct = 1.0
  c.mean = IMAGENET_MEAN
  c.std = IMAGENET_STD
  c.augment_on = "host"
  c.rrc_canvas = None
  c.decoded_cache_mb = 4096
  c.train_split_on = "host"
  c.num_threads = 4
  c.num_workers = 0
  c.prefetch = 4
  return c


# ------------------------------------------------------------------------------------------------
# On-device batch augmentation (locvit.data.device_augment)


def mixup_config() -> ml_collections.ConfigDict:
  """Mixup/CutMix off. DeiT: mixup_alpha 0.8, cutmix_alpha 1.0, prob 1.0, switch_prob 0.5."""
  c = ml_collections.ConfigDict()
  c.mixup_alpha = 0.0
  c.cutmix_alpha = 0.0
  c.prob = 1.0
  c.switch_prob = 0.5
  c.mode = "batch"
  c.correct_lam = True
  return c


def erasing_config() -> ml_collections.ConfigDict:
  """Random erasing off. DeiT: prob 0.25, mode 'pixel' (timm's ``--reprob 0.25 --remode pixel``).

  ``aspect``: how the box's aspect ratio is drawn in [min_aspect, 1 / min_aspect], 'log_uniform'
  (timm) or 'uniform' (Zhong et al.'s code, which the GMM paper's code copies); ``fill``: mode
  'const''s per-channel values in normalised space (empty: 0, the mean colour); ``attempts``: box
  draws before an example is left unchanged (timm 10, Zhong et al. 100).
  """
  c = ml_collections.ConfigDict()
  c.prob = 0.0
  c.mode = "pixel"
  c.min_area = 0.02
  c.max_area = 1.0 / 3.0
  c.min_aspect = 0.3
  c.aspect = "log_uniform"
  c.fill = ()
  c.attempts = 10
  return c


# ------------------------------------------------------------------------------------------------
# Distillation (locvit.distill)


def distillation_config() -> ml_collections.ConfigDict:
  """Distillation off. ConViT Table 4 / DeiT: type 'hard', alpha 0.5."""
  c = ml_collections.ConfigDict()
  c.type = "none"
  c.teacher_workdir = ml_collections.config_dict.placeholder(str)
  c.teacher_step = -1
  c.teacher_model = ""
  c.teacher_overrides = ml_collections.ConfigDict()
  c.alpha = 0.5
  c.tau = 1.0
  return c


# ------------------------------------------------------------------------------------------------
# Initialization (locvit.init)


# GPSA's initial gating_param when a prior is added to a plain DeiT (locvit.convert.prior).
PRIOR_GATE_LOGIT = -10.0


def init_from_config() -> ml_collections.ConfigDict:
  """Off by default; the thresholds are ``locvit.models.surgery.PruneThresholds``' defaults
  (the reference code's).

  ``workdir`` starts from another locvit run's checkpoint (``locvit.init.from_checkpoint``);
  ``weights`` from published or converted weights (``locvit.convert.load_pretrained``): a
  ``.safetensors`` / ``.pth`` / ``.bin`` / ``.npz`` file, a ``locvit.convert`` output, or a hub
  name (``hf-hub:timm/convit_tiny.fb_in1k``, ``convit_tiny.fb_in1k``). Either way only the
  parameters are taken: the optimizer state, the step and the data position start fresh.
  """
  c = ml_collections.ConfigDict()
  c.workdir = ml_collections.config_dict.placeholder(str)
  c.weights = ml_collections.config_dict.placeholder(str)
  c.step = -1
  c.prune_degenerate_heads = False
  c.min_sq_spread = 1e-5
  c.min_eigenvalue = 1e-5
  c.max_condition = 1e3
  # With init_from.weights of a plain DeiT and a model.name of that DeiT whose overrides add a
  # locality prior (layer_attention with 'gpsa', 'gmm' or 'elm', class_token_layer,
  # attention_kwargs): the DeiT's parameters go into the new model, the prior's set to start from
  # the DeiT's function where the math allows (locvit.convert.prior). prior_gate: GPSA's initial
  # gating_param (-10: sigmoid 4.5e-5 on position, trainable; <= -88: closed, exact, inert).
  c.add_prior = False
  c.prior_gate = PRIOR_GATE_LOGIT
  return c


INIT_NAMES = ("none", "trunc_normal", "kaiming_uniform", "xavier_normal", "mimetic", "impulse")
DEFAULT_CACHE_DIR = "~/.cache/locvit/impulse_init"
# The impulse solve's settings (the paper's / reference code's, Zheng, Li, Lucey Sec. 5.4;
# ``locvit.init.impulse.SolverConfig`` documents them and takes its defaults from here). Unset
# (None), steps, lr and norm_every take the value of the named ``solver`` preset
# (``locvit.init.impulse.SOLVER_PRESETS``).
IMPULSE_SOLVE = dict(
  filter_size=3,
  mode="same",
  pseudo_input="pe",
  pseudo_input_first=None,
  steps=None,
  lr=None,
  norm_every=None,
  cover_offsets=False,
  rank_tol=1e-7,
)
# Pseudo inputs of the impulse solve (``locvit.init.pseudo_inputs``).
PSEUDO_INPUTS = ("pe", "gaussian", "uniform", "pe+gaussian", "pe+uniform")

# Every init block's fields, then each scheme's own (seed None: the run's config.seed).
INIT_COMMON = dict(seed=None, qk_layout="vit", qk_pattern=None)
INIT_FIELDS = {
  "none": {},
  "trunc_normal": {},
  "kaiming_uniform": {},
  "xavier_normal": {},
  "mimetic": dict(
    base="kaiming_uniform", alpha=0.7, beta=0.7, v_alpha=0.4, v_beta=-0.4, vproj="reference"
  ),
  "impulse": dict(
    base="kaiming_uniform", solver="paper", **IMPULSE_SOLVE, cache_dir=DEFAULT_CACHE_DIR
  ),
}
_PLACEHOLDER_TYPES = dict(
  qk_pattern=str,
  pseudo_input_first=str,
  cache_dir=str,
  seed=int,
  steps=int,
  norm_every=int,
  lr=float,
)


def init_config(name: str = "impulse", **overrides: Any) -> ml_collections.ConfigDict:
  """The ``config.init`` block for ``name`` with its defaults; ``overrides`` replace fields.

  Every field exists (None where unset) so command-line overrides such as
  ``--config.init.mode=different`` work with a locked config. For 'impulse', ``solver`` names
  the Adam settings ('paper': 10,000 steps, 'fast': 500; ``impulse.SOLVER_PRESETS``); ``steps``,
  ``lr`` or ``norm_every`` set explicitly replace the preset's. ``locvit.init.init_config`` also
  checks the solver preset.
  """
  if name not in INIT_NAMES:
    raise ValueError(f"Unknown init {name!r}. Valid names: {list(INIT_NAMES)}.")
  fields = {"name": name, **INIT_COMMON, **INIT_FIELDS[name]}
  unknown = sorted(set(overrides) - set(fields))
  if unknown:
    raise ValueError(f"init {name!r} has no fields {unknown}. Valid fields: {sorted(fields)}.")
  fields.update(overrides)
  # Optional fields need a type for ConfigDict overrides: declare them as placeholders.
  cfg = ml_collections.ConfigDict()
  for key, value in fields.items():
    if value is None and key in _PLACEHOLDER_TYPES:
      cfg[key] = ml_collections.config_dict.placeholder(_PLACEHOLDER_TYPES[key])
    else:
      cfg[key] = value
  return cfg


# ------------------------------------------------------------------------------------------------
# Models (locvit.models)

# ConViT (locvit.models.convit): the first LOCAL_UP_TO_LAYER of DEPTH blocks are GPSA.
CONVIT_LOCAL_UP_TO_LAYER = 10
CONVIT_DEPTH = 12


def convit_layers(
  local_up_to_layer: int = CONVIT_LOCAL_UP_TO_LAYER, depth: int = CONVIT_DEPTH
) -> tuple[str, ...]:
  """Per-layer attention kinds: GPSA for the first ``local_up_to_layer`` blocks, MHSA after."""
  if not 0 <= local_up_to_layer <= depth:
    raise ValueError(f"local_up_to_layer={local_up_to_layer} must be in [0, depth={depth}].")
  return ("gpsa",) * local_up_to_layer + ("mhsa",) * (depth - local_up_to_layer)


def convit_overrides(
  local_up_to_layer: int = CONVIT_LOCAL_UP_TO_LAYER, depth: int = CONVIT_DEPTH
) -> dict[str, Any]:
  """``create_model`` overrides for a ConViT with ``local_up_to_layer`` GPSA blocks of ``depth``.

  The class token is concatenated just before the first MHSA block, as in the reference.
  """
  return {
    "depth": depth,
    "layer_attention": convit_layers(local_up_to_layer, depth),
    "class_token_layer": local_up_to_layer,
  }


# ConvMixer (locvit.models.convmixer): the frozen depthwise filters and their biases, a ``freeze``
# pattern (Zheng, Li, Lucey Table 5).
FROZEN_FILTERS = r"(^|/)blocks_\d+/spatial/(kernel|bias)$"


# ------------------------------------------------------------------------------------------------
# Optimizer and schedule (locvit.optim), mesh (locvit.platform.sharding)


def optimizer_config() -> ml_collections.ConfigDict:
  """``config.optimizer``: the optimizer (``locvit.optim``) and its hyper-parameters."""
  c = ml_collections.ConfigDict()
  c.name = "adamw"
  c.lr = 1e-3
  c.lr_base_batch_size = 0  # > 0: lr scales by batch_size / lr_base_batch_size
  c.b1 = 0.9
  c.b2 = 0.999
  c.eps = 1e-8
  c.weight_decay = 0.05
  c.decay_mask = "intended"
  c.momentum = 0.9
  c.nesterov = False
  # Update all parameters as one flat vector (optax.flatten: fewer, larger kernels per step).
  # The optimizer state's structure differs: a checkpoint resumes only with its own setting.
  c.flatten = False
  return c


def schedule_config() -> ml_collections.ConfigDict:
  """``config.schedule``: the learning-rate schedule (``locvit.optim``)."""
  c = ml_collections.ConfigDict()
  c.name = "cosine"
  c.warmup_epochs = 5.0
  c.warmup_steps = 0  # > 0 overrides warmup_epochs
  c.warmup_init_lr = 1e-6
  c.min_lr = 1e-5
  c.boundaries_epochs = ()  # for 'step'
  c.decay_factor = 0.1
  # 'step': the learning rate changes every optimizer step; 'epoch': it holds the schedule's value
  # at each epoch's first step for the whole epoch (timm's and epfml/attention-cnn's schedulers,
  # stepped once per epoch).
  c.update_every = "step"
  # 'cosine' after a warmup: True counts the cosine from the warmup's end (it starts at the peak);
  # False from step 0 (timm's default ``warmup_prefix=False``: the first rate after the warmup is
  # the cosine's value at the warmup's length).
  c.warmup_prefix = True
  return c


def mesh_config() -> ml_collections.ConfigDict:
  """``config.mesh``: the device mesh and how the state is laid out over it."""
  c = ml_collections.ConfigDict()
  c.shape = (-1, 1)  # (data, model); -1 fills with the device count
  c.layout = "dp"  # 'dp' | 'fsdp' | 'tp'
  c.rules = ()  # explicit logical-axis rules override the layout
  c.num_devices = 0  # 0: all devices; N: the first N (single-process debugging)
  return c


# ------------------------------------------------------------------------------------------------
# Analysis (locvit.analysis.locality)


def analysis_config() -> ml_collections.ConfigDict:
  """``config.analysis`` fields (attach to a top-level config as ``c.analysis``).

  Fields:
    locality: log locality metrics (nonlocality, gates, centres) at each evaluation.
    locality_mode: 'per_layer' or 'faithful' (see ``locvit.analysis.locality``).
    locality_num_images: the first N eval images (fixed for the whole run) averaged over.
    map_layers: layers whose attention maps ``analyze`` draws (Fig. 7); () = the paper's
      layers 2 and 10 (indices 1 and 9) clipped to the depth.
    query: (row, col) of the query patch of the maps; () = the centre patch.
    map_image_index: which of the fixed eval images the maps use.
    center_plots: at each evaluation, write the attention-centre plot of the Gaussian
      (Cordonnier quadratic, GPSA / PSA) layers to ``WORKDIR/plots/centers_step_<step>.png``
      (Cordonnier Figs. 3-4 over training); an error at start-up for a model without such layers.
  """
  c = ml_collections.ConfigDict()
  c.locality = False
  c.locality_mode = "per_layer"
  c.locality_num_images = 64
  c.map_layers = ()
  c.query = ()
  c.map_image_index = 0
  c.center_plots = False
  return c


# ------------------------------------------------------------------------------------------------
# Completing a config with these defaults


def with_defaults(
  config: ml_collections.ConfigDict, default: ml_collections.ConfigDict
) -> ml_collections.ConfigDict:
  """A copy of ``config`` with every field of ``default`` it lacks set to the default's value.

  Sub-configs present in both are completed field by field (an ``init`` block from
  ``init_config(name)``, without a ``cache_dir``: a block without one solves without a cache); a
  field the config sets, None included, keeps its value. The copy is locked if ``config`` is.
  """
  out = copy.deepcopy(config)
  locked = out.is_locked
  out.unlock()
  _complete(out, default)
  if locked:
    out.lock()
  return out


def _complete(config: ml_collections.ConfigDict, default: ml_collections.ConfigDict) -> None:
  for key in default:
    if key not in config:
      config[key] = default._fields[key]  # a placeholder keeps its type
    elif isinstance(config[key], ml_collections.ConfigDict) and isinstance(
      default[key], ml_collections.ConfigDict
    ):
      block = default[key]
      if key == "init" and config[key].get("name", "none") in INIT_NAMES:
        block = init_config(config[key].get("name", "none"))
        if "cache_dir" in block:
          block.cache_dir = None
      _complete(config[key], block)
