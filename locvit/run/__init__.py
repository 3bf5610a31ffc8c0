"""What a training run is made of, below the loop in ``locvit.train``.

- ``state``: the ``TrainState``, its shardings and abstract shape, initialisation;
- ``step``: the jitted training step and the non-finite guard;
- ``bundle``: ``build``, everything a run needs, built from a validated config.
"""
