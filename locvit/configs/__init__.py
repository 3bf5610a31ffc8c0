"""The shipped experiment configs, importable as ``locvit.configs.NAME`` and runnable by name.

A wheel carries them in this package (``setup.cfg`` maps ``locvit.configs`` to the repository's
top-level ``configs/`` folder, whose ``__init__.py`` then replaces this file). In a checkout this
file points the package at that folder, so configs import each other as ``locvit.configs.NAME``
in both places and ``--config=configs/NAME.py`` keeps working from the repository root.
"""

import os

_CHECKOUT_CONFIGS = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), "configs"
)
if os.path.isdir(_CHECKOUT_CONFIGS):
  __path__ = [_CHECKOUT_CONFIGS]
