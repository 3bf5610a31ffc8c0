"""A TFDS builder for an image folder on disk: the offline stand-in for `tfds build cifar10`.

It reads the layout of ``python -m locvit.data.prepare cifar10 --format=jpeg --out=DIR``
(``train/<class>/*.jpg``, ``test/<class>/*.jpg``) from the manual directory, like
``imagenet2012`` reads its manual tar files, so ``tfds build`` prepares it in ArrayRecord format
without network access (README, "Data"):

  tfds build experiments/tfds/cifar10_jpeg --manual_dir=DIR --data_dir=DATA_DIR \\
      --file_format=array_record
"""

import os

import tensorflow_datasets as tfds

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class Builder(tfds.core.GeneratorBasedBuilder):
  """CIFAR-10 re-encoded as 32x32 JPEG, from an extracted image folder."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "Extract cifar10-jpeg.tar.gz into manual_dir: manual_dir/{train,test}/<class>/*.jpg."
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          "image": tfds.features.Image(shape=(32, 32, 3), encoding_format="jpeg"),
          "label": tfds.features.ClassLabel(names=CLASSES),
        }
      ),
      supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = dl_manager.manual_dir
    return {split: self._generate_examples(root / split) for split in ("train", "test")}

  def _generate_examples(self, folder):
    for label in CLASSES:
      for name in sorted(os.listdir(folder / label)):
        # The JPEG bytes are stored as they are (no re-encoding).
        yield f"{label}/{name}", {"image": folder / label / name, "label": label}
