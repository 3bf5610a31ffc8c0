"""Evaluating or predicting with published weights, no training: the model, the class count and
the preprocessing are the weights' (``locvit.convert.load_pretrained``).

  python -m locvit.main --mode=predict --config.init_from.weights=convit_tiny.fb_in1k \
    --data=image_folder:PHOTOS --workdir=DIR
  python -m locvit.main --mode=eval --config=pretrained \
    --config.init_from.weights=deit_small.safetensors --config.model.name=deit_small_patch16_224 \
    --data=image_folder:IMAGENET --workdir=DIR

``locvit.main`` takes this config when the command names weights but no ``--config`` (and the
workdir holds no run). Weights that do not name their architecture (a bare file) run as
``model.name`` with ``model.overrides``; ``--data`` names the images (``DIR/test/<class>/*`` is
evaluated; ``--mode=predict`` also reads a folder of loose images).
"""

from locvit.configs.common import base_config
from locvit.configs.datasets import use_image_folder


def get_config():
  c = base_config()
  c.model.name = "convit_tiny"
  c.data.name = "image_folder"
  use_image_folder(c.data, None)  # --data=image_folder:DIR gives it
  c.data.image_size = 224
  c.data.interpolation = "bicubic"
  c.eval_batch_size = 32
  c.batch_size = 32
  return c
