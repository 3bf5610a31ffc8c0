"""What a training run is made of, below the loop in ``locvit.train``.

- ``state``: the ``TrainState``, its shardings and abstract shape, initialisation;
- ``step``: the jitted training step and the non-finite guard;
- ``evaluation``: the evaluation pass (loss and accuracy over an eval split, every example once);
- ``bundle``: ``build``, everything a run needs, built from a validated config.
"""
