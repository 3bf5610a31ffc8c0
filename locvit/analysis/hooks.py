"""The training loop's optional analysis hooks, passed in by the caller so that the loop does not
import ``locvit.analysis``::

  train.train_and_evaluate(config, workdir, **training_hooks())

Each runs at every evaluation when ``config.analysis`` asks for it (``locality``,
``center_plots``) and does nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

from locvit.analysis import centers, locality


def training_hooks() -> dict[str, Callable]:
  """``train_and_evaluate``'s hook arguments: locality metrics (ConViT Figs. 5-6) and attention
  centre plots (Cordonnier et al. Figs. 3-4)."""
  return {
    "make_locality_logger": locality.make_locality_logger,
    "make_center_plotter": centers.make_center_plotter,
  }
