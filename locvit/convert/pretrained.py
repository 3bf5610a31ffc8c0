"""Published ConViT / DeiT weights by hub name or file, ready to evaluate or fine-tune.

>>> pretrained = load_pretrained('hf-hub:timm/convit_tiny.fb_in1k')   # or 'convit_tiny.fb_in1k'
>>> logits = pretrained.create_model().apply(pretrained.variables, images)
>>> tuned = load_pretrained('convit_tiny.pth', model='convit_tiny', num_classes=10, img_size=160)

What ``name_or_path`` may be:

- a file: ``.safetensors``, ``.pth`` / ``.pt`` / ``.bin`` (needs PyTorch) or ``.npz`` holding a
  timm (or official) state dict; ``model=`` names the architecture;
- a directory: a ``python -m locvit.convert`` output, or a timm ``local-dir`` (``config.json``
  beside ``model.safetensors`` or ``pytorch_model.bin``);
- a Hugging Face hub name, ``hf-hub:ORG/NAME[@REVISION]`` or timm's bare ``NAME.TAG``
  (``convit_tiny.fb_in1k`` is ``hf-hub:timm/convit_tiny.fb_in1k``; a bare ``NAME`` takes timm's
  tag for ConViT and DeiT, ``fb_in1k``). It is read with ``huggingface_hub`` and works offline
  from the cache (``HF_HUB_OFFLINE=1``; ``HF_HUB_CACHE`` or ``HF_HOME`` name the cache). The
  repository's ``config.json`` (timm's ``pretrained_cfg``) gives the architecture, the class count
  and the preprocessing.

Fine-tuning at another class count or resolution follows timm: a class count other than the
weights' gets a freshly initialised ``head`` (and ``head_dist``), the learned ``pos_embed`` is
resampled to the new patch grid (``locvit.models.resampling.resample_abs_pos_embed``: bicubic,
antialiased), for DeiT and for ConViT alike; each change is one line of ``Pretrained.notes``. GPSA's
positional attention is computed from the grid's relative offsets, so it follows the new grid
without any parameter changing. Every other parameter is ``from_timm``'s conversion.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from locvit.convert.checkpoint import load_converted, read_state_dict
from locvit.convert.timm import ConversionError, from_timm, resolve_timm_name, to_numpy
from locvit.models import convit_overrides, create_model, default_image_size
from locvit.models.registry import parse_override
from locvit.models.resampling import resample_abs_pos_embed

HUB_PREFIX = "hf-hub:"
HUB_ORG = "timm"  # a bare NAME.TAG is timm's name for hf-hub:timm/NAME.TAG
DEFAULT_TAG = "fb_in1k"  # timm's tag of every ConViT and DeiT ImageNet-1k checkpoint
HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # timm's order of preference
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
HEAD_NAMES = ("head", "head_dist")  # the classifiers a new class count replaces

# timm's resolve_data_config defaults (timm/data/constants.py), used where the weights say nothing.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875
# timm's pretrained_cfg crop_pct of the DeiT checkpoints (deit.py: 0.9; 1.0 at 384). ConViT's
# take the default.
DEIT_CROP_PCT = {224: 0.9, 384: 1.0}


class WeightsError(ValueError):
  """Weights that cannot be found, read or fitted; the message is one line naming the way out."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The evaluation preprocessing the weights were published with, as timm's
  ``resolve_model_data_config`` gives it: resize the shorter side to
  ``floor(image_size / crop_pct)`` (``interpolation``), centre-crop ``image_size``, scale to
  [0, 1] and normalise by ``mean`` / ``std``."""

  input_size: tuple[int, int, int] = (3, 224, 224)
  interpolation: str = "bicubic"
  mean: tuple[float, ...] = IMAGENET_MEAN
  std: tuple[float, ...] = IMAGENET_STD
  crop_pct: float = DEFAULT_CROP_PCT
  crop_mode: str = "center"

  @property
  def image_size(self) -> int:
    """The side of the square the model sees."""
    return int(self.input_size[-1])

  @classmethod
  def from_pretrained_cfg(cls, cfg: Mapping[str, Any], image_size: int | None = None):
    """From timm's ``pretrained_cfg`` (a hub ``config.json``'s), missing fields at timm's
    defaults; ``image_size`` replaces its input size."""
    size = tuple(cfg.get("input_size") or cls.input_size)
    if image_size is not None:
      size = (size[0], image_size, image_size)
    return cls(
      input_size=tuple(int(s) for s in size),
      interpolation=cfg.get("interpolation") or cls.interpolation,
      mean=tuple(float(m) for m in cfg.get("mean") or cls.mean),
      std=tuple(float(s) for s in cfg.get("std") or cls.std),
      crop_pct=float(cfg.get("crop_pct") or cls.crop_pct),
      crop_mode=cfg.get("crop_mode") or cls.crop_mode,
    )


# The pretrained_cfg fields DataConfig reads; `python -m locvit.convert --workdir` saves a run's.
PREPROCESSING_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


def architecture_data_config(model_name: str, image_size: int | None = None) -> DataConfig:
  """timm's ``pretrained_cfg`` preprocessing of a ConViT / DeiT checkpoint without a
  ``config.json`` (a bare file): ImageNet mean and std, bicubic, crop_pct 0.875 for ConViT, 0.9
  for DeiT at 224 and 1.0 at 384."""
  size = image_size or default_image_size(model_name)
  crop = DEFAULT_CROP_PCT
  if model_name.startswith("deit_"):
    crop = DEIT_CROP_PCT.get(default_image_size(model_name), DEFAULT_CROP_PCT)
  return DataConfig(input_size=(3, size, size), crop_pct=crop)


@dataclasses.dataclass(frozen=True)
class Weights:
  """Where a name or path led: ``path`` (a file, or a ``locvit.convert`` directory), what the
  hub's or local ``config.json`` says (``{}`` if none) and the name as given."""

  name: str
  path: str
  config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  converted: bool = False  # path is a locvit.convert output (Flax parameters)

  @property
  def architecture(self) -> str | None:
    """The timm architecture the weights name (``config.json`` or a converter's metadata)."""
    return self.config.get("architecture")

  @property
  def pretrained_cfg(self) -> dict[str, Any]:
    """timm's ``pretrained_cfg``: the nested block, with the top-level class count and labels."""
    cfg = dict(self.config.get("pretrained_cfg") or {})
    for key in ("num_classes", "label_names", "label_descriptions"):
      if key in self.config:
        cfg[key] = self.config[key]
    return cfg


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """Weights ready for ``create_model(model, num_classes=num_classes, **overrides)``."""

  variables: dict[str, Any]  # {'params': ...}, host NumPy
  model: str  # the registered locvit name
  num_classes: int
  overrides: dict[str, Any]
  data_config: DataConfig
  source: str  # the file or directory read
  label_names: tuple[str, ...] | None  # one per class, when the weights' classes are known
  notes: tuple[str, ...] = ()  # one line per change: a new head, a resampled pos_embed

  @property
  def image_size(self) -> int:
    """The input side the parameters fit."""
    return self.data_config.image_size

  def create_model(self, **overrides: Any):
    """The model these variables fit (``overrides`` added, e.g. ``dtype``)."""
    return create_model(self.model, num_classes=self.num_classes, **{**self.overrides, **overrides})


# ------------------------------------------------------------------------------------------------
# Finding the weights


def _truthy(value: str | None) -> bool:
  return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
  """Whether the hub is off limits (``HF_HUB_OFFLINE``), read now rather than at import."""
  return _truthy(os.environ.get("HF_HUB_OFFLINE"))


def hub_cache_dir() -> str | None:
  """The cache ``huggingface_hub`` reads: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else its own
  default (None), read now rather than at import."""
  if os.environ.get("HF_HUB_CACHE"):
    return os.environ["HF_HUB_CACHE"]
  if os.environ.get("HF_HOME"):
    return os.path.join(os.environ["HF_HOME"], "hub")
  return None


def hub_repo(name: str) -> tuple[str, str | None] | None:
  """``(repo_id, revision)`` for ``hf-hub:ORG/NAME[@REV]`` or a bare timm ``NAME[.TAG]`` of a
  supported model; None for anything else (a path)."""
  if name.startswith(HUB_PREFIX):
    repo, _, revision = name.removeprefix(HUB_PREFIX).partition("@")
    return repo, revision or None
  if os.sep in name or "/" in name or name.endswith(WEIGHT_SUFFIXES):
    return None
  arch, _, tag = name.partition(".")
  try:
    resolve_timm_name(arch)
  except ValueError:
    return None
  return f"{HUB_ORG}/{arch}.{tag or DEFAULT_TAG}", None


class NotCachedError(WeightsError):
  """A hub file that is not in the cache while the hub is off limits or out of reach."""


def _hub_download(name: str, repo: str, revision: str | None, filename: str) -> str:
  """The cached (or downloaded) path of ``repo``'s ``filename``; FileNotFoundError when the
  repository has no such file, NotCachedError when the cache lacks it and the hub cannot say."""
  from huggingface_hub import hf_hub_download
  from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError

  try:
    return hf_hub_download(
      repo,
      filename,
      revision=revision,
      cache_dir=hub_cache_dir(),
      local_files_only=hub_offline(),
    )
  except LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError: first)
    why = "HF_HUB_OFFLINE=1" if hub_offline() else "the hub cannot be reached"
    raise NotCachedError(
      f"{name}: {repo}/{filename} is not in the Hugging Face cache "
      f"({hub_cache_dir() or 'huggingface_hub default'}) and {why}: fetch it once where the hub "
      f"is reachable (`hf download {repo}`) and point HF_HUB_CACHE at that cache, or give a "
      "local weights file"
    ) from None
  except EntryNotFoundError:  # the repository has no such file
    raise FileNotFoundError(filename) from None
  except OSError as e:  # the hub refuses (no such repository, no access)
    raise WeightsError(
      f"{name}: cannot read {repo}/{filename} from the Hugging Face hub ({e}); check the name, "
      "or give a local weights file"
    ) from None


def _resolve_hub(name: str, repo: str, revision: str | None) -> Weights:
  try:
    config_path = _hub_download(name, repo, revision, "config.json")
  except FileNotFoundError:
    raise WeightsError(
      f"{name}: {repo} has no config.json (not a timm model repository); give a local weights "
      "file and its --config.model.name"
    ) from None
  with open(config_path) as f:
    config = json.load(f)
  not_cached = None
  for filename in HUB_WEIGHT_FILES:  # the first the cache (or the hub) has
    try:
      return Weights(name, _hub_download(name, repo, revision, filename), config)
    except FileNotFoundError:
      continue
    except NotCachedError as e:
      not_cached = not_cached or e
  if not_cached is not None:
    raise not_cached
  raise WeightsError(
    f"{name}: {repo} holds none of {', '.join(HUB_WEIGHT_FILES)}; give a local weights file"
  )


def _resolve_directory(name: str, path: str) -> Weights:
  if os.path.isfile(os.path.join(path, "config.json")):  # timm's local-dir
    with open(os.path.join(path, "config.json")) as f:
      config = json.load(f)
    for filename in HUB_WEIGHT_FILES:
      if os.path.isfile(os.path.join(path, filename)):
        return Weights(name, os.path.join(path, filename), config)
    raise WeightsError(
      f"{name}: a directory with config.json but none of {', '.join(HUB_WEIGHT_FILES)} beside it"
    )
  if os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")):  # python -m locvit.convert
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
      meta = dict(checkpointer.metadata(os.path.abspath(path)).custom_metadata or {})
    config = {"architecture": meta.get("model"), "num_classes": meta.get("num_classes")}
    config["overrides"] = meta.get("overrides") or {}
    config["pretrained_cfg"] = {k: meta[k] for k in PREPROCESSING_KEYS if k in meta}
    return Weights(name, path, config, converted=True)
  raise WeightsError(
    f"{name}: a directory that is neither a `python -m locvit.convert` output nor a timm model "
    "folder (config.json + model.safetensors); give a weights file"
  )


def resolve_weights(name_or_path: str | os.PathLike) -> Weights:
  """Finds the weights a name or path stands for (module docstring); ``WeightsError`` with a
  one-line message when there are none."""
  name = os.fspath(name_or_path)
  if os.path.isdir(name):
    return _resolve_directory(name, name)
  if os.path.isfile(name):
    if not name.endswith(WEIGHT_SUFFIXES):
      raise WeightsError(
        f"{name}: not a weights file; expected one of {', '.join(WEIGHT_SUFFIXES)}, a "
        "`python -m locvit.convert` output or a hub name (hf-hub:timm/convit_tiny.fb_in1k)"
      )
    return Weights(name, name)
  repo = hub_repo(name)
  if repo is None:
    looks_like_repo = name.count("/") == 1 and not name.startswith(("/", ".", "~"))
    hint = f" (a hub repository is written hf-hub:{name})" if looks_like_repo else ""
    raise WeightsError(
      f"{name}: no such file or directory{hint}; give a .safetensors, .pth/.bin or .npz file, a "
      "`python -m locvit.convert` output, or a hub name such as hf-hub:timm/convit_tiny.fb_in1k "
      "or convit_tiny.fb_in1k"
    )
  return _resolve_hub(name, *repo)


# ------------------------------------------------------------------------------------------------
# Fitting them to a model


def imagenet_class_names() -> tuple[str, ...]:
  """The 1000 ImageNet-1k class descriptions in class-index order (WordNet lemmas, as timm's
  ``ImageNetInfo().label_descriptions()``), shipped with locvit."""
  text = resources.files("locvit.convert").joinpath("data/imagenet1k_classes.tsv").read_text()
  return tuple(line.split("\t", 1)[1] for line in text.splitlines())


def _label_names(weights: Weights, num_classes: int) -> tuple[str, ...] | None:
  cfg = weights.pretrained_cfg
  names = cfg.get("label_names")
  if names is not None and len(names) == num_classes:
    if isinstance(names, Mapping):
      names = [names[k] for k in sorted(names, key=int)]
    descriptions = cfg.get("label_descriptions") or {}
    return tuple(str(descriptions.get(n, n)) for n in names)
  if num_classes == 1000:
    return imagenet_class_names()
  return None


def _family(keys: Sequence[str]) -> str:
  """'ConViT' if the state dict has GPSA parameters, else 'DeiT'."""
  return "ConViT" if any(k.endswith("gating_param") for k in keys) else "DeiT"


def _model_name(weights: Weights, model: str | None, keys: Sequence[str]) -> tuple[str, dict]:
  """The locvit name to build (``model`` if given, else the weights' architecture) and the
  overrides the architecture name implies (``distilled``)."""
  arch = weights.architecture
  chosen = model or arch
  if chosen is None:
    raise WeightsError(
      f"{weights.name}: the file does not say its architecture; name it "
      f"(--config.model.name=..., e.g. {_family(keys).lower()}_tiny, or model=...)"
    )
  try:
    name, implied = resolve_timm_name(chosen)
  except ValueError as e:
    raise WeightsError(f"{weights.name}: {e}") from None
  if model and arch:
    src, _ = resolve_timm_name(arch)
    if src.split("_")[0] != name.split("_")[0]:
      raise WeightsError(
        f"{weights.name} holds {arch} weights, which do not fit {model}: use "
        f"--config.model.name={src} (model={src!r}), or weights of a {name.split('_')[0]}"
      )
  family = _family(keys)
  if keys and family.lower() != name.split("_")[0]:
    gpsa = "with" if family == "ConViT" else "without"
    raise WeightsError(
      f"{weights.name} does not fit {name}: these are {family} weights ({gpsa} GPSA "
      f"gating_param); use a {family.lower()}_* model, or {name.split('_')[0]} weights"
    )
  return name, implied


# timm's ConViT / DeiT constructor arguments that a hub config.json's ``model_args`` may carry and
# that are locvit VisionTransformer fields of the same meaning.
SAME_MODEL_ARGS = ("embed_dim", "num_heads", "patch_size", "depth", "mlp_ratio", "qkv_bias")


def model_args_overrides(weights: Weights, name: str) -> dict[str, Any]:
  """The ``create_model`` overrides of a ``config.json``'s ``model_args`` (timm passes them to
  ``create_model``): the fields of ``SAME_MODEL_ARGS``, and ConViT's ``local_up_to_layer`` as
  ``convit_overrides``; ``img_size`` is the weights' input size, read from ``pos_embed``."""
  args = dict(weights.config.get("model_args") or {})
  args.pop("img_size", None)
  overrides = {k: args.pop(k) for k in SAME_MODEL_ARGS if k in args}
  if "local_up_to_layer" in args or (name.startswith("convit_") and "depth" in overrides):
    default = create_model(name, num_classes=1)
    local = args.pop("local_up_to_layer", default.class_token_layer)
    overrides.update(convit_overrides(local, overrides.get("depth", default.depth)))
  if args:
    raise WeightsError(
      f"{weights.name}: config.json model_args {sorted(args)} have no locvit equivalent; give the "
      f"weights as a file with --config.model.name and its overrides"
    )
  return overrides


def _prefix_tokens(model) -> int:
  """Rows of ``pos_embed`` before the patches: the class (and distillation) token when they join
  at the input (DeiT); none when the class token joins later (ConViT)."""
  return model.num_prefix_tokens if model.class_token_layer == 0 else 0


def _check_distillation_token(source: str, name: str, has_token: bool, distilled: bool) -> None:
  """Distilled DeiT weights (timm's ``deit_*_distilled_*``: ``dist_token``, ``head_dist``, two
  prefix rows in ``pos_embed``) fit a ``distilled`` model only, and a distilled model needs them:
  one line naming the way out, before the pos_embed rows are read with the wrong prefix count."""
  if has_token and not distilled:
    raise WeightsError(
      f"{source} does not fit {name}: these are distilled DeiT weights (dist_token, head_dist); "
      "give --config.model.overrides.distilled=True (distilled=True), or weights without a "
      "distillation token"
    )
  if distilled and not has_token:
    raise WeightsError(
      f"{source} does not fit {name} with a distillation token (distilled=True, or distillation "
      "on): these weights have none; give distilled DeiT weights (deit_*_distilled_*)"
    )


def _source_image_size(pos_rows: int, prefix: int, patch_size: int, name: str) -> int:
  side = math.isqrt(pos_rows - prefix)
  if side * side != pos_rows - prefix:
    raise WeightsError(
      f"{name}: pos_embed has {pos_rows} rows, which is no square patch grid after {prefix} "
      "prefix token(s); these weights cannot be resampled (other weights, or the model they were "
      "trained as)"
    )
  return side * patch_size


def _fresh_params(model, image_size: int, seed: int) -> dict:
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  variables = jax.jit(model.init)(jax.random.key(seed), images)
  return jax.device_get(flax.linen.meta.unbox(variables["params"]))


def _mismatch(name: str, model: str, error: ConversionError) -> WeightsError:
  counts = "; ".join(line.rstrip(":") for line in str(error).splitlines() if "key(s)" in line)
  return WeightsError(
    f"{name} does not fit {model}: {counts}; give the model fields the weights were trained with "
    "(--config.model.overrides.FIELD=VALUE, e.g. depth) or other weights"
  )


def _read_weights(weights: Weights) -> tuple[dict | None, dict[str, np.ndarray]]:
  """``(params, {})`` of a ``locvit.convert`` output, or ``(None, state_dict)`` of a PyTorch /
  safetensors file as numpy arrays; a file that cannot be read raises ``WeightsError``."""
  if weights.converted:
    return jax.device_get(load_converted(weights.path)["params"]), {}
  try:
    return None, {k: to_numpy(v) for k, v in read_state_dict(weights.path).items()}
  except ImportError as e:
    raise WeightsError(str(e)) from None
  except Exception as e:  # a damaged or foreign file: its reader's own message
    raise WeightsError(f"{weights.path}: cannot be read as weights ({e})") from None


def _converted_keys(params: Mapping[str, Any]) -> list[str]:
  """The keys that tell a converted model's architecture (``_model_name``)."""
  return ["gating_param"] if _has_gating(params) else ["pos_embed"]


def _architecture(
  weights: Weights, model: str | None, keys: list[str], overrides: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
  """The model name to build and its ``create_model`` overrides: what the weights imply (a
  converter's saved overrides, a hub ``config.json``'s ``model_args``), then the caller's."""
  name, implied = _model_name(weights, model, keys)
  if weights.converted:  # the converter's overrides, then the caller's
    saved = weights.config.get("overrides") or {}
    implied.update({k: parse_override(name, k, _unrepr(v)) for k, v in saved.items()})
  elif model is None:  # the hub's architecture, as its model_args build it
    implied.update(model_args_overrides(weights, name))
  return name, {**implied, **overrides}


def _params_as_trained(
  weights: Weights,
  name: str,
  converted: dict | None,
  state_dict: dict[str, np.ndarray],
  prefix: int,
  patch: int,
  overrides: dict[str, Any],
) -> tuple[dict, int, int]:
  """``(params, classes, image size)`` of the weights as they were trained: a PyTorch state
  dict converted (``from_timm``) at its own image size and class count."""
  if converted is not None:
    classes = int(np.shape(converted["head"]["kernel"])[-1])
    pos = np.asarray(converted["pos_embed"])
    source_size = _source_image_size(pos.shape[1], prefix, patch, weights.name)
    return jax.tree.map(np.asarray, converted), classes, source_size
  if "head.weight" not in state_dict or "pos_embed" not in state_dict:
    raise _mismatch(weights.name, name, ConversionError("missing key(s): head, pos_embed"))
  classes = int(state_dict["head.weight"].shape[0])
  source_size = _source_image_size(state_dict["pos_embed"].shape[1], prefix, patch, weights.name)
  try:
    params = from_timm(name, state_dict, image_size=source_size, num_classes=classes, **overrides)[
      "params"
    ]
  except ConversionError as e:
    raise _mismatch(weights.name, name, e) from None
  except ValueError as e:
    raise WeightsError(f"{weights.name}: {e}") from None
  return jax.tree.map(np.asarray, params), classes, source_size


def _resample_pos_embed(
  params: dict, name: str, source_size: int, img_size: int, patch: int, prefix: int
) -> list[str]:
  """Resamples ``params['pos_embed']`` in place from ``source_size`` to ``img_size`` pixels
  (bicubic, antialiased); returns the note saying so, or none when the sizes agree."""
  if img_size % patch:
    raise WeightsError(
      f"{name}: image size {img_size} is not a multiple of the patch size {patch}; "
      f"choose a multiple of {patch}"
    )
  if img_size == source_size:
    return []
  grid = (img_size // patch, img_size // patch)
  params["pos_embed"] = resample_abs_pos_embed(params["pos_embed"], grid, num_prefix_tokens=prefix)
  old = source_size // patch
  return [
    f"pos_embed resampled from a {old}x{old} to a {grid[0]}x{grid[1]} patch grid "
    f"({source_size} -> {img_size} px, bicubic, antialiased)"
  ]


def load_pretrained(
  name_or_path: str | os.PathLike | Weights,
  *,
  model: str | None = None,
  num_classes: int | None = None,
  img_size: int | None = None,
  seed: int = 0,
  **overrides: Any,
) -> Pretrained:
  """Reads published (or converted) ConViT / DeiT weights and fits them to a locvit model.

  Args:
    name_or_path: a weights file, a ``locvit.convert`` output or timm folder, or a hub name
      (module docstring); or what ``resolve_weights`` found for one.
    model: the registered locvit (or timm) name to build; default: the weights' architecture
      (a hub ``config.json``, a converter's metadata). Weights of another architecture are
      refused.
    num_classes: the classifier width; default: the weights'. Another width gets a fresh ``head``
      (and ``head_dist``), initialised from ``seed``.
    img_size: the input side; default: the weights'. Another grid resamples ``pos_embed``.
    seed: the key of a fresh head.
    **overrides: ``create_model`` fields the weights were trained with (``depth=6``, ...).

  Returns:
    ``Pretrained``: the variables, the model, the preprocessing, the class names, one note per
    change.

  Raises:
    WeightsError: a one-line message for missing weights, a hub name not in the offline cache,
      weights of another architecture, or a ``pos_embed`` that cannot be resampled.
  """
  weights = name_or_path if isinstance(name_or_path, Weights) else resolve_weights(name_or_path)
  converted, state_dict = _read_weights(weights)
  keys = list(state_dict) if converted is None else _converted_keys(converted)
  name, overrides = _architecture(weights, model, keys, overrides)
  target = create_model(name, num_classes=1, **overrides)
  has_dist_token = "dist_token" in (state_dict if converted is None else converted)
  _check_distillation_token(weights.name, name, has_dist_token, target.distilled)
  prefix, patch = _prefix_tokens(target), target.patch_size
  params, source_classes, source_size = _params_as_trained(
    weights, name, converted, state_dict, prefix, patch, overrides
  )
  num_classes = num_classes or source_classes
  img_size = img_size or source_size
  notes = _resample_pos_embed(params, weights.name, source_size, img_size, patch, prefix)
  if num_classes != source_classes:
    fresh = _fresh_params(create_model(name, num_classes=num_classes, **overrides), img_size, seed)
    heads = [h for h in HEAD_NAMES if h in params]
    for head in heads:
      params[head] = fresh[head]
    notes.append(
      f"{' and '.join(heads)} re-initialised: the weights have {source_classes} classes, the "
      f"model {num_classes}"
    )

  cfg = weights.pretrained_cfg
  data_config = (
    DataConfig.from_pretrained_cfg(cfg, img_size)
    if cfg
    else architecture_data_config(name, img_size)
  )
  return Pretrained(
    variables={"params": params},
    model=name,
    num_classes=num_classes,
    overrides=overrides,
    data_config=data_config,
    source=weights.path,
    label_names=_label_names(weights, num_classes) if num_classes == source_classes else None,
    notes=tuple(notes),
  )


def _has_gating(params: Mapping[str, Any]) -> bool:
  flat = flax.traverse_util.flatten_dict(params)
  return any(path[-1] == "gating_param" for path in flat)


def _unrepr(text: Any) -> str:
  """A converter metadata value (``repr`` of the override) as ``parse_override`` reads it."""
  try:
    value = ast.literal_eval(text) if isinstance(text, str) else text
  except (ValueError, SyntaxError):
    return str(text)
  return str(value).lower() if isinstance(value, bool) else str(value)
