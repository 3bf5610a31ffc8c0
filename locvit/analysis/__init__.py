"""Analysis of trained and initialised models, reports and plots only; import the submodules
directly. ``hooks.training_hooks()`` are the training loop's optional per-evaluation analyses.

- ``locality``, ``plots``: ConViT's nonlocality (Eq. 8), gates and attention maps (d'Ascoli et
  al., Sec. 4, Figs. 5-7);
- ``analyze``: ``--mode=analyze``, a run's curves and attention figures, with each model's own
  mechanism (GPSA gates, Gaussian centres, GMM / ELM masks);
- ``centers``: Cordonnier et al.'s attention-centre plots and attention-probability grids;
- ``pruning``: Cordonnier et al.'s degenerate-head pruning (appendix E) of a finished run, with its
  report (the surgery itself is ``locvit.models.surgery``);
- ``conv_equivalence``: Cordonnier et al.'s Theorem 1, a convolution as quadratic attention;
- ``masks``: learned GMM / ELM masks unfolded per query (Li & Zhang, Figs. 3-4);
- ``init_maps``: attention maps at initialization (Zheng, Li, Lucey, Fig. 3).
"""
