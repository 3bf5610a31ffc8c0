"""Plans for ``python -m locvit.reproduce PLAN``: the rows of one paper table or one headline
comparison, as shipped config names (``FILE:ARG``) plus overrides, each with the paper's number.

Plain data. Per plan: ``title``, ``rows`` (name -> ``config``, ``overrides``, ``paper_top1``,
``paper_epochs``, ``paper_train_examples``: the paper's training set size, so that the fraction
of its budget counts images seen) and ``comparisons`` (pairs of row names: baseline,
treatment); optional ``max_steps`` caps the steps per run, optional ``note`` is a sentence about
the paper's numbers that the plan's report carries.

Two kinds of plan:

- budget plans (the reduced ones, CPU-sized): the command gives every row the same number of
  steps so that all runs fit ``--minutes``, and replaces each row's ``total_steps`` and warmup by
  the budget's;
- paper-protocol plans (``"protocol": True``): every row trains its shipped table config as the
  paper did (model, data, recipe, batch, schedule, epochs), or a stated ``--fraction`` of it.
  A row may add ``data: "cifar10_image_folder"`` (read the CIFAR-10 image folder in
  ``$CIFAR10_ROOT``, full training set: lossless PNG, JPEG only with ``--allow_lossy_data``),
  ``kit`` (the ``KIT_H200`` model whose measurements estimate its time), ``paper_table`` (where
  the paper prints its number; else the plan's) and ``optional: True`` (run only when ``--rows``
  names it). The plan adds ``paper_table``, ``paper_test_examples`` (the test split each
  evaluation reads), ``seeds`` (per row without ``--seeds``) and ``evaluation``: how the official
  code evaluated (``every_epochs``), which top-1 it reported (``paper_reports``: 'best' of those
  evaluations or 'final') and where (``code``).
"""

CIFAR10_TRAIN = 50_000
CIFAR10_TEST = 10_000

# Protocol plans' seeds per row: the fewest whose paired t test has a degree of freedom to spare
# (df 2, t 4.30; 2 seeds need t 12.7). What they can separate against the paper's smallest gap
# depends on the seed spread, which no paper states: --dry_run prints the largest spread that
# separates it, and the report says where ours did not (locvit.reproduce.seeds).
PROTOCOL_SEEDS = 3

# What the accelerator kit measured on one NVIDIA H200 (docs/benchmarks.md, "Accelerator kit",
# Tables 1 and 2; bf16 compute): the basis of ``--dry_run``'s estimate without a probe. Per kit
# model (the config the kit built; the docs' labels "ViT d9" / "GMM-ViT d9" name other depths):
# the step time with the batch resident at batch 512 and the images/s trained from the CIFAR-10
# JPEG folders with augmentation on the device, and its compile seconds; where a paper-protocol
# run has trained on the GPU, ``loop_step_ms`` is that loop's measured step at ``loop_batch``.
# ``compute_tflops`` is the best achieved rate the kit measured (DeiT-S at 224: 3,540 GFLOP per
# step in 28.26 ms).
KIT_H200 = {
  "device": "NVIDIA H200",
  "date": "2026-11-26",
  "source": "docs/benchmarks.md, Accelerator kit, Tables 1 and 2; docs/results.md, GPU run",
  "compute_tflops": 3540 / 28.26,
  "models": {
    "gmm_small": {
      "config": "gmm_cifar10_small:gmm",
      "batch": 512,
      "step_ms": 7.34,
      "compile_s": 27.5,
      "fed_images_per_sec": 55_212,
      "recipe": "pad-4 crop + flip + autoaug-cifar10, on the device",
      # gmm_table1_cifar10's vit row trained on an H200 (2026-11-26, docs/results.md): the whole
      # loop's median logged rate at batch 128 (JPEG folders, augmentation on the device,
      # checkpoints every 128 steps), 8,359 img/s: a 15.3 ms step against 4.06 ms resident.
      "loop_step_ms": 128 / 8_359 * 1e3,
      "loop_batch": 128,
      # The kit's step of GMM-ViT d9 at batch 128 with the batch resident (docs/benchmarks.md,
      # "Issue 29's profile"; the ViT row's model with GMM masks): the part of the loop's step
      # that is the step's kernels.
      "loop_resident_step_ms": 4.06,
      "loop_split_on": "host",  # data.train_split_on of that loop (the plans now hold it on device)
    },
    "structinit_small": {
      "config": "structinit_cifar10_small",
      "batch": 512,
      "step_ms": 4.08,
      "compile_s": 30.0,
      "fed_images_per_sec": 10_926,
      "recipe": "bicubic RRC + flip + rand-m9-mstd0.5-inc1, on the device",
    },
    "convit_small": {
      "config": "convit_cifar10_small:convit",
      "batch": 512,
      "step_ms": 7.51,
      "compile_s": 23.4,
      "fed_images_per_sec": 60_018,
      "recipe": "pad-4 crop + flip, on the device",
    },
  },
}

# XLA:GPU's kernel count of the step that trains N seeds side by side (``locvit.run.seeds.
# make_step``, ``config.num_seeds=N``) per measured N, and of the lone step one seed trains with:
# compiled for an H200 without one (XLA's deviceless compilation, every GEMM a cuBLAS call), bf16
# compute, the batch resident (docs/benchmarks.md, "Seeds side by side"). Until a GPU times the
# N-seed step, ``--dry_run`` scales the kit model's one-seed step by these counts; they are
# counts, not times. Per kit model: the paper config whose steps were compiled (the GMM plan's
# depth-9 model at its batch; the structured-init plan's ViT-T/2 at its batch).
KIT_SEED_KERNELS = {
  "device": "NVIDIA H200",
  "date": "2026-12-06",
  "commit": "6df901d",
  "command": "python benchmarks/seeds_side_by_side.py --gpu=h200 --seeds=1,2,3,4,8",
  "models": {
    "gmm_small": {
      "measured": "GMM-ViT d9 at batch 128",
      "lone": 474,
      "seeds": {1: 528, 2: 518, 3: 519, 4: 519, 8: 520},
    },
    "structinit_small": {
      "measured": "StructInit ViT-T/2 at batch 512",
      "lone": 713,
      "seeds": {1: 746, 2: 696, 3: 698, 4: 701, 8: 733},
    },
  },
}

# Paper-protocol rows train with the augmentation on the device and the decoded training split
# held there: the host sends each step only its rows' indices, and a random-resized crop's box is
# drawn in the step (docs/benchmarks.md, "The training split on the device"). Their precision is
# their config's, the official code's: float32 for GMM and Cordonnier (no autocast), bf16 mixed
# precision for structured init (the README's ``--amp``, fp16 there); the optional ``*_bf16`` rows
# train the float32 rows in bf16. The kit measured bf16 steps: a float32 row's estimate is low.
GPU_OVERRIDES = {
  "data.augment_on": "device",
  "data.train_split_on": "device",
}
BF16 = {"mixed_precision": True}

# GMM paper (Li & Zhang), CIFAR-10: Table 3's rows (ViT-base / GMM-ViT top-1, %), the official
# ``create_model('vit')`` (depth 9, dim 192) and ``create_model('vit_d15')`` (depth 15, dim 144).
GMM_TABLE3 = {"d9": (94.17, 94.87), "d15": (93.65, 95.06)}
GMM_ELM_D9 = 94.65  # Table 6, ELM-ViT d9 (Table 6 prints GMM-ViT d9 at 94.94, Table 3 at 94.87)
GMM_INCONSISTENCY = (
  "Table 1 prints 93.65 / 95.06 for a 'depth 9, 2.7M' ViT / GMM-ViT, but Tables 3 and 6 give "
  "those numbers to the depth-15, dim-144 models (2,523,610 / 2,523,760 parameters) and 94.17 / "
  "94.87 to depth 9"
)


def gmm_row(config: str, top1: float | None, **extra) -> dict:
  """A gmm_table1_cifar10 row: ``config`` on the CIFAR-10 folders, 100 official epochs of 3
  passes."""
  return {
    "config": config,
    "data": "cifar10_image_folder",
    "overrides": {**GPU_OVERRIDES, **extra.pop("overrides", {})},
    "paper_top1": None if top1 is None else round(top1 / 100, 4),
    "paper_epochs": 300,  # 100 official epochs x 3 passes
    "paper_train_examples": CIFAR10_TRAIN,
    "kit": "gmm_small",
    **extra,
  }


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
  "smoke_protocol": {
    "title": "Smoke test of a paper-protocol plan: the digits quickstart ViT (width 32, depth 1) "
    "at the quickstart's own 30 epochs (CI)",
    "protocol": True,
    "paper_test_examples": 360,  # the digits quickstart's test split
    "evaluation": {
      "every_epochs": 1,
      "paper_reports": "best",
      "code": "none: the smoke plan evaluates as the protocol plans do",
    },
    "rows": {
      "depth1": {
        "config": "quickstart",
        "overrides": {
          "model.overrides.depth": 1,
          "model.overrides.embed_dim": 32,
          "model.overrides.num_heads": 2,
        },
        "paper_top1": None,
        "paper_epochs": 30,
        "paper_train_examples": 1437,
      }
    },
    "comparisons": [],
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
  "gmm_table1_cifar10": {
    "title": "Li & Zhang, CIFAR-10: ViT vs GMM-ViT at depth 9 (dim 192) and depth 15 (dim 144), "
    "Table 3's numbers (Table 1 prints the depth-15 pair, 93.65 / 95.06, as depth 9); the "
    "official 100 epochs of 3 passes, batch 128, float32",
    "note": f"The paper is inconsistent: {GMM_INCONSISTENCY}.",
    "protocol": True,
    "paper_table": "Table 3",
    "paper_test_examples": CIFAR10_TEST,
    "seeds": PROTOCOL_SEEDS,
    "evaluation": {
      "every_epochs": 3,  # one official epoch: 3 passes (RASampler, repeats 3)
      "paper_reports": "best",
      "code": "main.py validates after each of its 100 epochs and logs best_acc1",
    },
    "rows": {
      "vit": gmm_row("gmm_table3:d9,base", GMM_TABLE3["d9"][0]),
      "gmm": gmm_row("gmm_table3:d9,gmm", GMM_TABLE3["d9"][1]),
      "vit_d15": gmm_row("gmm_table3:d15,base", GMM_TABLE3["d15"][0]),
      "gmm_d15": gmm_row("gmm_table3:d15,gmm", GMM_TABLE3["d15"][1]),
      "elm": gmm_row(
        "gmm_table56:cifar10,d9,elm", GMM_ELM_D9, paper_table="Table 6", optional=True
      ),
      # The float32 rows in bf16 compute (fp32 parameters): what precision costs or saves.
      "vit_bf16": gmm_row("gmm_table3:d9,base", GMM_TABLE3["d9"][0], overrides=BF16, optional=True),
      "gmm_bf16": gmm_row("gmm_table3:d9,gmm", GMM_TABLE3["d9"][1], overrides=BF16, optional=True),
      # Beyond the papers: GMM-ViT whose q/k start from the impulse-3 solve (Zheng, Li, Lucey),
      # every other weight (GMM kernels included) initialised as in the GMM row. No paper
      # reports it.
      "gmm_impulse3": gmm_row(
        "gmm_table3:d9,gmm",
        None,
        init="impulse3",
        overrides={"init.base": "xavier_normal"},  # only q/k change: the GMM row's init else
        optional=True,
      ),
    },
    "comparisons": [
      ("vit", "gmm"),
      ("vit_d15", "gmm_d15"),
      ("vit", "elm"),
      ("elm", "gmm"),
      ("vit_bf16", "gmm_bf16"),
      ("gmm", "gmm_impulse3"),
      ("vit", "gmm_impulse3"),
    ],
  },
  "structinit_table2_cifar10": {
    "title": "Zheng, Li, Lucey Table 2, CIFAR-10: ViT-T/h3 (patch 2) from trunc-normal, mimetic "
    "and impulse-3 init (200 epochs, batch 512)",
    "protocol": True,
    "paper_table": "Table 2",
    "paper_test_examples": CIFAR10_TEST,
    "seeds": PROTOCOL_SEEDS,
    "evaluation": {
      "every_epochs": 1,
      "paper_reports": "best",
      "code": "timm's train.py validates every epoch and prints its Best metric",
    },
    "rows": {
      init: {
        "config": f"structinit_datasets:cifar10,{init}",
        "data": "cifar10_image_folder",
        "overrides": GPU_OVERRIDES,
        "paper_top1": top1,
        "paper_epochs": 200,
        "paper_train_examples": CIFAR10_TRAIN,
        "kit": "structinit_small",
      }
      for init, top1 in (("trunc_normal", 0.8863), ("mimetic", 0.9116), ("impulse3", 0.9162))
    },
    "comparisons": [
      ("trunc_normal", "impulse3"),
      ("trunc_normal", "mimetic"),
      ("mimetic", "impulse3"),
    ],
  },
  "cordonnier_table1": {
    "title": "Cordonnier, Loukas & Jaggi Table 1, CIFAR-10: SA quadratic vs SA learned vs "
    "ResNet18 (300 epochs, batch 100, SGD lr 0.1, float32)",
    "protocol": True,
    "paper_table": "Table 1",
    "paper_test_examples": CIFAR10_TEST,
    "seeds": PROTOCOL_SEEDS,
    "evaluation": {
      "every_epochs": 1,
      "paper_reports": "best",
      "code": "train.py tests every epoch and returns the best accuracy",
    },
    "rows": {
      **{
        name: {
          "config": f"cordonnier_cifar10:{arg}",
          "data": "cifar10_image_folder",
          "overrides": {**GPU_OVERRIDES, **extra},
          "paper_top1": top1,
          "paper_epochs": 300,
          "paper_train_examples": CIFAR10_TRAIN,
          "kit": "convit_small",
          **({"optional": True} if extra else {}),
        }
        for name, arg, top1, extra in (
          ("quadratic", "quadratic", 0.938, {}),
          ("learned", "learned", 0.918, {}),
          ("resnet18", "resnet18", 0.938, {}),
          # The quadratic row in bf16 compute (fp32 parameters).
          ("quadratic_bf16", "quadratic", 0.938, BF16),
        )
      },
    },
    "comparisons": [("resnet18", "quadratic"), ("learned", "quadratic")],
  },
}
