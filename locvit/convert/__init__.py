"""timm / official PyTorch checkpoints -> Flax variables for locvit's registered models.

>>> variables = from_timm('convit_tiny', torch.load('convit_tiny.pth', weights_only=True))
>>> logits = create_model('convit_tiny').apply(variables, images)

Command line: ``python -m locvit.convert --model=convit_tiny --input=w.pth --output=DIR``, then
``load_converted(DIR)``.
"""

from locvit.convert.checkpoint import (
  load_converted,
  read_state_dict,
  save_converted,
  unwrap_state_dict,
)
from locvit.convert.timm import (
  ConversionError,
  expected_state_dict_shapes,
  from_timm,
  resolve_model_name,
  supported_models,
)

__all__ = [
  "ConversionError",
  "expected_state_dict_shapes",
  "from_timm",
  "load_converted",
  "read_state_dict",
  "resolve_model_name",
  "save_converted",
  "supported_models",
  "unwrap_state_dict",
]
