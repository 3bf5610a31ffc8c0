"""What a training run is made of, below the loop in ``locvit.train``.

- ``state``: the ``TrainState``, its shardings and abstract shape, initialisation;
- ``step``: the jitted training step and the non-finite guard;
- ``evaluation``: the evaluation pass (loss and accuracy over an eval split, every example once);
- ``checks``: every check of a run's config, before anything is created;
- ``bundle``: ``build``, everything a run needs, built from a validated config;
- ``cadence``: when the loop logs, saves, evaluates and dispatches.
"""
