"""Plans for ``python -m locvit.reproduce PLAN``: the rows of one paper table or one headline
comparison, as shipped config names (``FILE:ARG``) plus overrides, each with the paper's number.

Plain data. Per plan: ``title``, ``rows`` (name -> ``config``, ``overrides``, ``paper_top1``,
``paper_epochs``, ``paper_train_examples``: the paper's training set size, so that the fraction
of its budget counts images seen) and ``comparisons`` (pairs of row names: baseline,
treatment); optional ``max_steps`` caps the steps per run.
The command replaces each row's ``total_steps`` and warmup by the budget's.
"""

CIFAR10_TRAIN = 50_000

PLANS = {
  "smoke": {
    "title": "Smoke test: the digits quickstart ViT (width 32) at depth 1 vs depth 2 (CI)",
    "rows": {
      f"depth{depth}": {
        "config": "quickstart",
        "overrides": {
          "model.overrides.depth": depth,
          "model.overrides.embed_dim": 32,
          "model.overrides.num_heads": 2,
        },
        "paper_top1": None,  # no paper: the quickstart's own 30 epochs are the reference budget
        "paper_epochs": 30,
        "paper_train_examples": 1437,
      }
      for depth in (1, 2)
    },
    "comparisons": [("depth1", "depth2")],
    "max_steps": 60,  # seconds per run, whatever the budget
  },
  "structinit": {
    "title": "Structured initialization (Zheng, Li, Lucey), Table 2's CIFAR-10 column: "
    "trunc-normal vs impulse-3 vs mimetic ViT (reduced: depth 8, dim 64, patch 4, 10% of "
    "CIFAR-10)",
    "rows": {
      init: {
        "config": f"structinit_cifar10_small:{init}",
        "overrides": {},
        "paper_top1": top1,
        "paper_epochs": 200,
        "paper_train_examples": CIFAR10_TRAIN,
      }
      for init, top1 in (("trunc_normal", 0.8863), ("impulse3", 0.9162), ("mimetic", 0.9116))
    },
    # The paper's ordering: both structured inits above trunc-normal, Imp.-3 above mimetic.
    "comparisons": [
      ("trunc_normal", "impulse3"),
      ("trunc_normal", "mimetic"),
      ("mimetic", "impulse3"),
    ],
  },
  "convit_sample_efficiency": {
    "title": "ConViT vs DeiT at 10% of CIFAR-10 (ConViT's sample-efficiency claim, Table 2 / "
    "Fig. 2 idea; reduced: depth 6, 4 heads x 48)",
    "rows": {
      name: {
        "config": f"convit_cifar10_small:{name}",
        "overrides": {},
        # No CIFAR-10 number in the paper (its Table 2 is ImageNet subsets).
        "paper_top1": None,
        "paper_epochs": 300,
        "paper_train_examples": CIFAR10_TRAIN // 10,
      }
      for name in ("deit", "convit")
    },
    "comparisons": [("deit", "convit")],
  },
  "gmm": {
    "title": "ViT vs GMM-ViT on CIFAR-10 (Li & Zhang; reduced: depth 6, 10% of CIFAR-10)",
    "rows": {
      name: {
        "config": f"gmm_cifar10_small:{name}",
        "overrides": {},
        "paper_top1": top1,
        "paper_epochs": 300,  # 100 epochs x 3 repeated passes
        "paper_train_examples": CIFAR10_TRAIN,
      }
      for name, top1 in (("vit", 0.9365), ("gmm", 0.9506))
    },
    "comparisons": [("vit", "gmm")],
  },
  "cordonnier": {
    "title": "Cordonnier, Loukas & Jaggi Table 1: SA quadratic vs SA learned vs ResNet18 on "
    "CIFAR-10 (reduced models, 10% of CIFAR-10)",
    "rows": {
      name: {
        "config": f"cordonnier_cifar10_small:{name}",
        "overrides": {},
        "paper_top1": top1,
        "paper_epochs": 300,
        "paper_train_examples": CIFAR10_TRAIN,
      }
      for name, top1 in (("resnet", 0.938), ("quadratic", 0.938), ("learned", 0.918))
    },
    "comparisons": [("resnet", "quadratic"), ("quadratic", "learned")],
  },
}
