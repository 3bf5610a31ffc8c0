"""ConViT-S on ImageNet-1k: paper Table 1 (27M parameters, 5.4 GFLOPs, 81.3% top-1) and the
100% row of Table 2 (81.4% top-1, 95.8% top-5), trained with DeiT's recipe unchanged
(``configs.recipes``).

  python -m locvit.main --config=configs/convit_s.py --workdir=DIR

AdamW, lr 5e-4 x batch / 512 (= 1e-3 at batch 1024), eps 1e-8, weight decay 0.05 with the
official ConViT mask (``optimizer.decay_mask='official_convit'``; 'intended' is the corrected
one), 5 warmup epochs from 1e-6, cosine to 1e-5, 300 epochs, label smoothing 0.1, stochastic
depth 0.1, bicubic random-resized crop + flip, RandAugment rand-m9-mstd0.5-inc1, Mixup 0.8 /
CutMix 1.0, random erasing 0.25, repeated augmentation x3, eval centre crop 0.875 (the ``deit``
preset).

Data: TFDS ``imagenet2012`` in ArrayRecord format. TFDS cannot download ImageNet: put
ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar in ``DATA_DIR/downloads/manual``, then
``tfds build imagenet2012 --data_dir=DATA_DIR --file_format=array_record`` and pass
``--config.data.data_dir=DATA_DIR``. Without it the run stops at once with these instructions.
"""

from locvit.configs.convit_common import imagenet, paper_config


def get_config():
  return imagenet(paper_config("convit_small"))
