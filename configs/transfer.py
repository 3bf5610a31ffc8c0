"""Fine-tuning ImageNet-pretrained ConViT or DeiT on CIFAR-10, CIFAR-100 or an image folder, with
DeiT's published transfer recipe.

  python -m locvit.main --config=configs/transfer.py:convit_tiny,cifar10 --workdir=DIR
  python -m locvit.main --config=transfer:deit_small,folder,384 --data=image_folder:DIR --workdir=W
  python -m locvit.main --config=transfer:deit_tiny,cifar100,224,gpsa --workdir=DIR

Argument: ``MODEL,DATASET,SIZE,PRIOR``: ``convit_{tiny,small,base}`` (timm's ``convit_*``) or
``deit_{tiny,small,base}`` (``deit_*_patch16_224``); ``cifar10``, ``cifar100`` or ``folder`` (an
image folder DIR/{train,test}/<class>/*.jpg given by ``--data=image_folder:DIR``, its class count
read from it); ``224`` or ``384`` (the DeiT authors fine-tune at either, keeping patch 16: the
position embedding is resampled to the larger grid); for a DeiT, ``none`` or a locality prior added
to its pretrained weights (``init_from.add_prior``, ``locvit.convert.prior``): ``gpsa`` (ConViT's
plan: GPSA in blocks 0-9 taking the DeiT's attention weights, the class token before block 10),
``gmm`` (a Gaussian mixture mask in every block, the 'intended' kernel, so the model starts from
the DeiT's function) or ``elm`` (an element-wise mask in every block, starting at one).

The weights are timm's ImageNet-1k checkpoints by hub name (``convit_tiny.fb_in1k``,
``deit_tiny_patch16_224.fb_in1k``, ...: ``init_from.weights``, offline from the Hugging Face cache
with ``HF_HUB_OFFLINE=1``); ``--config.init_from.weights=FILE`` takes a local file instead.

Recipe (DeiT's transfer experiments; the authors' settings for CIFAR-10 and Cars in
facebookresearch/deit#45): DeiT's ImageNet recipe (``configs/recipes.py``: ``deit``) with SGD
(Nesterov momentum 0.9, timm's ``sgd``), lr 0.01, weight decay 1e-4 (coupled L2, as
``torch.optim.SGD``), batch 768, 1000 epochs, and no random erasing and no stochastic depth; the
rest unchanged: 5 warmup epochs from 1e-6 then cosine to 1e-5, bicubic random-resized crop (the
32x32 CIFAR images upsampled to SIZE) + flip, RandAugment, repeated augmentation x3, Mixup 0.8 /
CutMix 1.0, label smoothing 0.1, evaluation at SIZE / 0.875 then a centre crop, ImageNet mean/std.
DeiT's ``main.py`` scales its ``--lr`` by ``batch / 512`` (``optimizer.lr_base_batch_size=512``
here too), so ``--lr 0.01`` at batch 768 steps at 0.015; set
``--config.optimizer.lr_base_batch_size=0`` for 0.01 flat. The thread also allows AdamW "with a
smaller lr and the ImageNet weight decay".
"""

from locvit.configs import recipes
from locvit.configs.args import Field, choose, parse
from locvit.configs.common import base_config
from locvit.configs.datasets import use_dataset, use_image_folder
from locvit.configs.defaults import convit_layers

# argument -> locvit (and timm) model name
MODELS = {
  **{f"convit_{size}": f"convit_{size}" for size in ("tiny", "small", "base")},
  **{f"deit_{size}": f"deit_{size}_patch16_224" for size in ("tiny", "small", "base")},
}
DATASETS = ("cifar10", "cifar100", "folder")
SIZES = (224, 384)
DEPTH = 12  # every ConViT and DeiT size
PRIORS = {  # the model overrides that add each prior to a DeiT
  "none": {},
  "gpsa": {"layer_attention": convit_layers(10, DEPTH), "class_token_layer": 10},
  "gmm": {"layer_attention": ("gmm",) * DEPTH, "attention_kwargs": {"gmm": {"kernel": "intended"}}},
  "elm": {"layer_attention": ("elm",) * DEPTH},
}
ARGS = {
  "model": Field("convit_tiny", MODELS, "model"),
  "dataset": Field("cifar10", DATASETS, "dataset"),
  "size": Field(224, SIZES, "image size"),
  "prior": Field("none", PRIORS, "prior"),
}
PAIRS = {
  "model,prior": [f"{m},none" for m in MODELS]
  + [f"{m},{p}" for m in MODELS if m.startswith("deit") for p in PRIORS if p != "none"]
}
BATCH_SIZE = 768
EPOCHS = 1000


def get_config(arg: str | None = None):
  model, dataset, size, prior = parse(__file__, arg, ARGS).values()
  choose(__file__, "model,prior", f"{model},{prior}", PAIRS["model,prior"])
  c = recipes.apply(base_config(), "deit")
  c.model.name = MODELS[model]
  c.init_from.weights = f"{MODELS[model]}.fb_in1k"
  c.model.overrides.update(PRIORS[prior])
  c.init_from.add_prior = prior != "none"
  c.model.overrides.drop_path_rate = 0.0
  c.random_erasing.prob = 0.0
  c.optimizer.name = "sgd"
  c.optimizer.lr = 0.01
  c.optimizer.momentum = 0.9
  c.optimizer.nesterov = True
  c.optimizer.weight_decay = 1e-4
  c.batch_size = BATCH_SIZE
  c.num_epochs = float(EPOCHS)
  if dataset == "folder":
    c.data.name = "image_folder"
    c.data.num_classes = None  # the folder's
    use_image_folder(c.data, None)  # --data=image_folder:DIR gives it
  else:
    use_dataset(c, dataset)
  c.data.image_size = size
  c.log_every_steps = 100
  c.eval_every_steps = 5000
  c.checkpoint_every_steps = 5000
  return c
