"""The tiny test config as a config file, for command-line tests."""

from tests.train_utils import tiny_config


def get_config():
  return tiny_config()
