"""timm / official PyTorch checkpoints -> Flax variables for locvit's registered models.

>>> variables = from_timm('convit_tiny', torch.load('convit_tiny.pth', weights_only=True))
>>> logits = create_model('convit_tiny').apply(variables, images)

Published weights by hub name or file, fitted to a new class count or resolution (a fresh head, a
resampled ``pos_embed``), with their preprocessing:

>>> pretrained = load_pretrained('convit_tiny.fb_in1k', num_classes=10, img_size=160)
>>> logits = pretrained.create_model().apply(pretrained.variables, images)

Command line: ``python -m locvit.convert --model=convit_tiny --input=w.pth --output=DIR``, then
``load_converted(DIR)``.
"""

from locvit.convert.checkpoint import (
  load_converted,
  read_state_dict,
  save_converted,
  unwrap_state_dict,
)
from locvit.convert.pretrained import (
  DataConfig,
  Pretrained,
  WeightsError,
  imagenet_class_names,
  load_pretrained,
  resolve_weights,
)
from locvit.convert.timm import (
  ConversionError,
  expected_state_dict_shapes,
  from_timm,
  resolve_model_name,
  resolve_timm_name,
  supported_models,
)

__all__ = [
  "ConversionError",
  "DataConfig",
  "Pretrained",
  "WeightsError",
  "expected_state_dict_shapes",
  "from_timm",
  "imagenet_class_names",
  "load_converted",
  "load_pretrained",
  "read_state_dict",
  "resolve_model_name",
  "resolve_timm_name",
  "resolve_weights",
  "save_converted",
  "supported_models",
  "unwrap_state_dict",
]
