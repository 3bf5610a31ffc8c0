"""The machine a run executes on, as settings resolved once and passed down; no model knowledge.

- ``ops``: the kernel setting (``attention_implementation``) and the CPU kernels it selects;
- ``sharding``: meshes, logical-axis rules, the shardings of variables and batches;
- ``xla_options``: the compiler options of the training step, one setting;
- ``cpu_malloc``: the allocator XLA:CPU runs under;
- ``flops``: XLA's FLOP count of a lowering or a compiled executable.

Importing this package or ``cpu_malloc``, ``xla_options`` and ``flops`` imports no JAX.
"""
