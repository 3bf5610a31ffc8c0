"""Backbones and the model registry.

>>> model = create_model('deit_tiny_patch4_32', num_classes=10)
>>> variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
>>> logits = model.apply(variables, images, train=False)
>>> logits, inter = apply_with_intermediates(model, variables, images)   # attention maps etc.
>>> model = build_model(config, num_classes=10)   # from a training config (``factory``)

Head pruning and other parameter surgery: ``locvit.models.surgery``.
"""

from locvit.models.convit import convit_overrides as convit_overrides
from locvit.models.convmixer import ConvMixer as ConvMixer
from locvit.models.cordonnier import CordonnierNet as CordonnierNet
from locvit.models.factory import build_model
from locvit.models.intermediates import (
  apply_with_intermediates,
  block_attention_maps,
  collect_attention_maps,
)
from locvit.models.registry import create_model, default_image_size, list_models, register_model
from locvit.models.vit import VisionTransformer

__all__ = [
  "VisionTransformer",
  "apply_with_intermediates",
  "block_attention_maps",
  "build_model",
  "collect_attention_maps",
  "create_model",
  "default_image_size",
  "list_models",
  "register_model",
]
