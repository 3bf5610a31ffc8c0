"""ConViT paper appendix C (Fig. 11 left): ConViT+ vs DeiT+ on CIFAR-100 rescaled to 224x224.

  python -m locvit.main --config=configs/convit_cifar100.py:convit_tiny_plus --workdir=DIR

"We kept all hyperparameters unchanged, but rescaled the images to 224x224 and increased the
number of epochs": DeiT's recipe with the "+" changes (lr 4e-4, batch 512), bicubic random-resized
crop of the upscaled 32x32 images and flip, eval resize to 256 and centre crop 224 (as the
official transform does for any input size > 32), ImageNet mean/std, 3000 epochs (the Fig. 11
caption; the text notes overfitting after 1000). Paper: ConViT-Ti+ reaches 82.1% top-1 (10M
parameters); the other models' curves are only in the figure. Weight decay:
``decay_mask='official_convit'`` (the ConViT code).

Data: TFDS ``cifar100`` in ArrayRecord format (``tfds build cifar100 --data_dir=DATA_DIR
--file_format=array_record`` on a machine with network access, then ``--data=tfds:DATA_DIR``), or
the image folder given by ``--data=image_folder:ROOT`` or ``$CIFAR100_ROOT`` (``python -m
locvit.data.prepare cifar100 --out=ROOT`` writes it).

Argument: ``convit_{tiny,small,base}_plus`` or ``deit_{tiny,small,base}_plus``.
"""

from locvit.configs.args import Field, parse
from locvit.configs.convit_common import every_epoch, paper_config
from locvit.configs.datasets import use_dataset

CIFAR100_TRAIN_IMAGES = 50_000
MODELS = {
  f"{family}_{size}_plus": f"{family}_{size}_plus"
  for family in ("convit", "deit")
  for size in ("tiny", "small", "base")
}
PAPER_TOP1 = {"convit_tiny_plus": 82.1}
EPOCHS = 3000
ARGS = {"model": Field("convit_tiny_plus", MODELS, "appendix C model")}


def get_config(arg: str | None = None):
  (model,) = parse(__file__, arg, ARGS).values()
  c = paper_config(model)
  use_dataset(c, "cifar100")
  c.data.image_size = 224
  c.num_epochs = float(EPOCHS)
  every_epoch(c, CIFAR100_TRAIN_IMAGES)
  return c
