"""Building the model a training config names (``config.model`` and the run-level switches).

>>> model = build_model(config, num_classes=10)
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from locvit.attention.softmax_attention import cudnn_rules_only
from locvit.models.registry import create_model


def distillation_enabled(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config.distillation`` is present and its ``type`` is not 'none'."""
  return config.distillation is not None and config.distillation.type != "none"


def check_student(model: nn.Module) -> None:
  """The student needs a distillation token; only the ViT family has one."""
  if not any(f.name == "distilled" for f in dataclasses.fields(model)):
    raise ValueError(
      f"distillation needs a student with a distillation token; {type(model).__name__} has none. "
      "Use a VisionTransformer-based model (deit_*, convit_*, vit_*)."
    )


def build_model(config: ml_collections.ConfigDict, num_classes: int) -> nn.Module:
  """The registered ``config.model.name`` with ``model.overrides`` (bf16 compute under
  ``mixed_precision``, the kernels of ``attention_implementation``), cloned with
  ``distilled=True`` and ``distilled_training=True`` (both heads' logits for the distillation
  loss) when distillation is on."""
  overrides = dict(config.model.overrides or {})
  if overrides.get("distilled_training") and not distillation_enabled(config):
    raise ValueError(
      "model.overrides.distilled_training=True returns both heads for the distillation loss, and "
      "distillation is off: give distillation.type='hard' or 'soft' with its teacher_workdir, or "
      "drop the override (a distilled=True model trains on its two heads combined, as timm does)"
    )
  if config.attention_implementation is not None:
    overrides.setdefault("attention_implementation", config.attention_implementation)
  if config.mixed_precision:
    overrides["dtype"] = jnp.bfloat16
  model = create_model(config.model.name, num_classes=num_classes, **overrides)
  if distillation_enabled(config):
    check_student(model)
    model = model.clone(distilled=True, distilled_training=True)
  return model


def check_attention_kernels(
  model: nn.Module, image_shape: tuple[int, ...], *, train: bool = True
) -> None:
  """Under ``attention_implementation='cudnn'``, raises the ValueError of the first attention call
  of the forward pass (of training, or with ``train=False`` of evaluation) that cuDNN's fused
  attention cannot take (sequence length, head dim or dtype;
  ``locvit.attention.softmax_attention.cudnn_refusal``), before anything is compiled.

  Traces the model abstractly (``jax.eval_shape``, no compilation) with the rules checked and XLA's
  kernel in cuDNN's place, so it runs on any host and sees every backbone's own token counts
  (class tokens, windows, class attention)."""
  if getattr(model, "attention_implementation", None) != "cudnn":
    return
  images = jax.ShapeDtypeStruct((1, *image_shape), jnp.float32)
  forward = lambda rng, x: model.init({"params": rng, "dropout": rng}, x, train=train)
  try:
    with cudnn_rules_only():
      jax.eval_shape(forward, jax.random.key(0), images)
  except ValueError as error:  # raised again without JAX's tracing frames and notes
    raise ValueError(str(error)) from None
