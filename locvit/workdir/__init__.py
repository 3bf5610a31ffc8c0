"""Everything a run keeps in its directory, each module named for its job.

- ``paths``: the path layer for local disks and object stores (etils.epath, the bucket clients);
- ``outage``: the one deadline a bucket that stops answering is given;
- ``lock``: the workdir's lock (a file, or a lease object in a bucket);
- ``checksums``: each checkpoint step's manifest of file digests;
- ``provenance``: which locvit commit trained which steps (``DIR/commits.json``);
- ``checkpoint``: the orbax checkpointer (last N + best, integrity, preemption);
- ``restore``: a model's variables from a workdir's checkpoints;
- ``saved_config``: the run's resolved config, ``DIR/config.json``;
- ``fingerprint``: what a checkpoint records of the config, and ``DIR/resume_log.json``.
"""
