"""Checkpoints with orbax: async saves, last-N plus best retention, resume on any topology.

``DIR/<step>`` keeps the last N steps and ``DIR/best/<step>`` the best one. A step holds:
- ``state``: the sharded ``TrainState`` (restored with the shardings of the abstract target);
- ``meta``: JSON given by the caller (the config fingerprint, ``locvit.workdir.fingerprint``), so an
  incompatible workdir is caught before compiling.

No data-iterator state is saved: the input position is a function of the global step
(``locvit.data.pipeline``), so a step saved by P processes with D devices restores onto any mesh
the config allows (orbax reshards the arrays to the target shardings). Steps saved by earlier
versions hold a ``data`` item too; it is not read.

Orbax writes each step into a temporary directory and renames it when complete, so an interrupted
save never leaves a half-written checkpoint that would be picked up on resume. Before a step is
committed, ``checksums.json`` (SHA-256 of each of its files) is added beside its items, in
orbax's background thread (``_Manifest``), so that a slow bucket never stalls training; a resume
verifies it (and that the restored state is finite), falls back to the newest intact step and
moves damaged steps to ``DIR/damaged/`` (never deleting anything). A committed step found without
its manifest (written by a synchronous save killed before hashing it, or by an older locvit) gets
it once orbax has read it back. On a bucket, what
the checkpointer is writing is named to the run's ``locvit.workdir.outage.Watch`` for the line a
dead bucket ends the run with. See docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from locvit.workdir import outage, paths
from locvit.workdir.checksums import CHECKSUMS, verify_checksums, write_checksums

BEST_METRIC = "eval/top1"
DAMAGED = "damaged"  # DIR/damaged/<step>: quarantined steps that failed verification


# A save's exchange between the run's processes failed: a peer process stopped or is late.
_PEER_LOST = re.compile(
  r"Gloo \w+ failed|NCCL error|Connection closed by peer|Barrier timed out", re.IGNORECASE
)


def _save_failure(error: BaseException) -> str:
  """The cause of a failed write: the OS error TensorStore names at the end of its message
  (``... [os_error_code='28']``: "No space left on device"); in a run of several processes, a
  collective of the save that failed as another process stopped or fell behind ("Gloo AllGather
  failed ... Connection closed by peer") says so, since that process's own error is the cause;
  else the first line."""
  code = re.search(r"\[os_error_code='(\d+)'\]", str(error))
  if code:
    return os.strerror(int(code.group(1)))
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  if jax.process_count() > 1 and _PEER_LOST.search(str(error)):
    return (
      "another process of this run did not reach the save's exchange (it stopped, or is late); "
      "its own output says why: " + outage.one_line(error)
    )
  return outage.one_line(error)


def _manager(
  directory: str,
  keep: int,
  async_save: bool,
  read_only: bool = False,
  barrier_prefix: str = "",
  on_written=None,
) -> ocp.CheckpointManager:
  # Read-only: creates no directory (a mistyped --workdir stays absent) and starts no background
  # clean-up of temporary directories (which could outlive a process that exits at once).
  # barrier_prefix: orbax names its multi-process barriers after the step alone, so two managers
  # saving the same step (last-N and best) would meet in one barrier and hang.
  temporary_path_class = None
  if paths.scheme(directory) == "s3":
    _let_orbax_write_arrays_to_s3()
    # No rename on S3 (s3fs's directory "rename" copies object by object, and fails on the
    # directory markers): a step is written in place and committed by its commit_success.txt,
    # as orbax does by default on GCS. Readers must use the same class to find committed steps.
    temporary_path_class = ocp.path.atomicity.CommitFileTemporaryPath
  options = ocp.CheckpointManagerOptions(
    # A reader keeps nothing and saves nothing; orbax warns about any other value.
    max_to_keep=None if read_only else keep,
    save_interval_steps=0 if read_only else 1,
    enable_async_checkpointing=async_save,
    cleanup_tmp_directories=not read_only,
    create=not read_only,
    read_only=read_only,
    multiprocessing_options=ocp.options.MultiprocessingOptions(
      barrier_sync_key_prefix=barrier_prefix or None
    ),
    temporary_path_class=temporary_path_class,
    # Called by orbax's save thread on the primary process once every process has written the
    # step, just before it commits it.
    async_options=ocp.AsyncOptions(post_finalization_callback=on_written) if async_save else None,
  )
  with _without_orbax_notice("Given directory is read only"):  # said for every reader, by design
    return _CheckpointManager(directory, item_names=("state", "meta"), options=options)


class _CheckpointManager(ocp.CheckpointManager):
  """orbax's manager, whose own questions about JAX's preemption sync point are answered from the
  training loop's answer (``Checkpointer.reached_preemption``) instead of asking JAX.

  JAX's sync manager takes the step of every question as its process's current step, and when a
  preemption notice comes each process reports its last one: the agreed step is the highest
  reported, plus one. orbax asks about the step it saves, at the start of a save and, on process
  0, in its save thread once the step is committed, while the loop has trained on: a notice then
  had process 0 report that older step, and the processes could agree on a step process 0 had
  already passed; the others saved it alone and waited for process 0 in the save's barrier, while
  process 0 waited for them in its next training step (a hang)."""

  preemption_step: int | None = None  # the step every process stops at, once the loop knows it

  def reached_preemption(self, step: int) -> bool:
    return step == self.preemption_step


def _let_orbax_write_arrays_to_s3() -> None:
  """Makes orbax (0.12) give TensorStore an ``s3`` kvstore spec for ``s3://`` checkpoint paths.

  orbax builds the spec of the array store from the path and knows only ``gs://`` (its own GCS
  spec) and local paths: for ``s3://B/K`` it collapses the ``//`` and raises "Checkpoint path
  should be absolute" (orbax/checkpoint/_src/serialization/tensorstore_utils.py,
  ``_normalize_path`` and ``_build_ocdbt_kvstore_tspec``), and it has no option to pass a spec or
  an endpoint. So ``build_kvstore_tspec``, which every orbax reader and writer calls through the
  module, is wrapped once: an ``s3://`` path is built as the same ``gs://`` path (OCDBT layout
  included), then its GCS driver spec is swapped for ``paths.tensorstore_s3_spec`` (which carries
  the endpoint of a local or S3-compatible server). Other paths are passed through unchanged."""
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

  build = getattr(ts_utils, "build_kvstore_tspec", None)
  if build is None:
    raise paths.PathError(
      f"s3:// checkpoints need orbax's tensorstore_utils.build_kvstore_tspec, absent in orbax "
      f"{getattr(ocp, '__version__', '?')}"
    )
  if getattr(build, "locvit_s3", False):
    return

  def to_s3(spec):
    if isinstance(spec, dict):
      if spec.get("driver") in ("gcs", "gcs_grpc"):
        return paths.tensorstore_s3_spec(spec["bucket"], spec["path"])
      return {key: to_s3(value) for key, value in spec.items()}
    if isinstance(spec, list):
      return [to_s3(value) for value in spec]
    return spec

  def build_kvstore_tspec(directory, *args, **kwargs):
    text = os.fspath(directory)
    if not text.startswith("s3://"):
      return build(directory, *args, **kwargs)
    return to_s3(build("gs://" + text.removeprefix("s3://"), *args, **kwargs))

  build_kvstore_tspec.locvit_s3 = True
  ts_utils.build_kvstore_tspec = build_kvstore_tspec


@contextlib.contextmanager
def _without_orbax_notice(text: str):
  """Drops absl log records containing ``text`` while the block runs."""
  drop = lambda record: text not in record.getMessage()
  absl_logger = logging.get_absl_logger()
  absl_logger.addFilter(drop)
  try:
    yield
  finally:
    absl_logger.removeFilter(drop)


_UNKNOWN = object()


class NoIntactCheckpointError(ValueError):
  """Every saved step failed verification; nothing was moved or deleted."""


class Checkpointer:
  """Orbax managers for ``DIR`` (the last ``keep`` steps, for resuming) and ``DIR/best`` (the
  step with the highest ``eval/top1`` so far).

  Keeping "best" in its own manager means newer steps can never rotate it out, also across
  restarts. Each step is committed with its ``checksums.json`` (``_Manifest``).

  ``watch``: the run's deadline of its bucket workdir (``outage.Watch``, from
  ``locvit.workdir.lock.claim``; None on a local disk), told what the checkpointer is writing.
  """

  def __init__(
    self,
    directory: str,
    *,
    keep: int = 3,
    keep_best: bool = True,
    async_save: bool = True,
    read_only: bool = False,
    watch: outage.Watch | None = None,
  ):
    self.directory = paths.path(directory)
    self.read_only = read_only
    self._manifests = {"last": _Manifest(self.directory)}
    self.manager = self._make_manager("last", max(keep, 1), async_save)
    self.best = None
    if keep_best:
      self._manifests["best"] = _Manifest(self.directory / "best")
      self.best = self._make_manager("best", 1, async_save)
    self._best_score: Any = _UNKNOWN
    self._last_saved: dict[int, int] = {}  # id(manager) -> the step it saves or saved last
    self._saving: tuple[int, int] | None = None  # (id(manager), step) inside manager.save
    self.watch = watch
    if watch is not None and not read_only:  # a bucket workdir: the line a dead bucket ends with
      watch.checkpoints = self._outage_report
    self.waited = 0.0  # seconds the last save waited for the previous one to be committed

  def _outage_report(self) -> tuple[str | None, str]:
    """(the save in flight, if any; the committed steps of ``DIR``), from memory alone: the
    bucket is not answering when this is asked."""
    in_flight = []
    for manager in (self.manager, self.best):
      step = self._last_saved.get(id(manager))
      if manager is None or step is None:
        continue
      if manager.is_saving_in_progress() or self._saving == (id(manager), step):
        in_flight.append((manager, step))
    pending = {s for m, s in in_flight if m is self.manager}
    committed = [s for s in self.manager.all_steps() if s not in pending]  # orbax's cached list
    text = f"Steps committed in {self.directory}: {', '.join(map(str, committed)) or 'none'}"
    if not in_flight:
      return None, text
    return f"the checkpoint save of step {in_flight[0][1]}", text

  def _make_manager(self, name: str, keep: int, async_save: bool) -> ocp.CheckpointManager:
    manifest = self._manifests[name]
    manifest.in_background = async_save
    directory = manifest.directory
    return _manager(directory, keep, async_save, self.read_only, name, manifest)

  def on_saved(self, record: Callable[[int], None]) -> None:
    """Calls ``record(step)`` on process 0 once each later step of ``DIR`` is written with its
    manifest: in orbax's save thread, just before it commits the step, when saving
    asynchronously (bookkeeping on a slow bucket then never holds the training loop); after the
    commit otherwise. An error it raises fails that step's save, as the manifest's would."""
    self._manifests["last"].on_written = record

  def latest_step(self) -> int | None:
    """The newest saved step in ``DIR``, or None when there is none."""
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    """The step kept in ``DIR/best``, or None (nothing saved yet, or ``keep_best=False``)."""
    return self.best.latest_step() if self.best is not None else None

  def best_score(self) -> float | None:
    """``eval/top1`` of the best checkpoint (read once from its metadata, then remembered), or
    None. Remembering it keeps every process's decision to save a new best the same while an
    asynchronous best save is still being committed."""
    if self._best_score is _UNKNOWN:
      step = self.best_step()
      meta = None
      if step is not None:
        args = ocp.args.Composite(meta=ocp.args.JsonRestore())
        meta = self.best.restore(step, args=args)["meta"]
      self._best_score = None if meta is None else meta["metrics"][BEST_METRIC]
    return self._best_score

  def set_best_score_to_beat(self, score: float) -> None:
    """With nothing in ``DIR/best`` (a workdir moved without it), a new best must beat ``score``:
    the best ``eval/top1`` the run recorded before, so ``DIR/best`` holds the run's best step or
    nothing, never a worse one."""
    if self.best_step() is None:
      self._best_score = score

  def saved_meta(self, step: int | None = None) -> dict[str, Any] | None:
    """The ``meta`` JSON (step, config fingerprint, eval metrics) of ``step`` (default: latest),
    or None when nothing is saved."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def _items(self, step, state, meta, metrics) -> ocp.args.Composite:
    meta = {"step": step, **meta, "metrics": metrics}
    return ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))

  def _save(self, manager, step, args, force) -> bool:
    manifest = self._manifests["best" if manager is self.best else "last"]
    try:
      with outage.doing(self.watch, f"the checkpoint save of step {step}"):
        start = time.perf_counter()
        manager.wait_until_finished()  # orbax's rule: one save at a time (no wait when it is done)
        self.waited = time.perf_counter() - start
        manifest.step = step
        previous, self._last_saved[id(manager)] = self._last_saved.get(id(manager)), step
        self._saving = (id(manager), step)  # in flight from here, for _outage_report
        saved = manager.save(step, args=args, force=force)
        if saved and not manifest.in_background:  # a synchronous save has committed the step
          manifest.write(manager.directory / str(step))
    except Exception as e:  # orbax raises TensorStore's and the writer thread's errors, any type
      raise self._save_error(manager, step, e) from e
    finally:
      self._saving = None
    if not saved:
      self._last_saved[id(manager)] = previous
    return saved

  def _save_error(self, manager, step: int, error: BaseException) -> CheckpointSaveError:
    # orbax's list of the steps (in memory: a failing bucket may not answer a listing)
    committed = [s for s in manager.all_steps() if s != step]
    return CheckpointSaveError(
      f"saving a checkpoint to {manager.directory} failed ({_save_failure(error)}); stopped at "
      f"step {step}. Steps already committed are kept: {committed}"
    )

  def save(self, step: int, state: Any, meta: dict, force: bool = False) -> bool:
    """Saves ``step``'s ``state`` into ``DIR``; ``meta`` is JSON kept beside it
    (``fingerprint.checkpoint_meta``). ``save_best`` keeps the best step, after evaluation."""
    items = self._items(step, state, meta, {})
    return self._save(self.manager, step, items, force)

  def save_best(self, step: int, state: Any, meta: dict, metrics: dict[str, Any]) -> bool:
    """Replaces ``DIR/best`` with ``step`` when its ``eval/top1`` beats the kept one's."""
    metrics = {k: float(v) for k, v in metrics.items() if k.startswith("eval/")}
    if self.best is None or BEST_METRIC not in metrics:
      return False
    best = self.best_score()
    if best is not None and metrics[BEST_METRIC] <= best:
      return False
    items = self._items(step, state, meta, metrics)
    self._best_score = metrics[BEST_METRIC]
    kept = self.best_step()
    if kept is not None and kept >= step:  # a run resumed below best/ (e.g. its newest step was
      self.best.wait_until_finished()  # damaged): the better, older-numbered step replaces it
      self.best.delete(kept)
    return self._save(self.best, step, items, force=True)

  def _quarantine(self, manager, step: int, tag: str = "") -> str:
    """Moves ``step`` of ``manager`` to ``DIR/damaged/`` (process 0), then every process reloads."""
    target = self.directory / DAMAGED / f"{tag}{step}"
    if jax.process_index() == 0:
      n = 1
      while target.exists():
        target = self.directory / DAMAGED / f"{tag}{step}.{n}"
        n += 1
      paths.move_tree(epath.Path(manager.directory) / str(step), target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"locvit_quarantine_{tag}{step}")
    manager.reload()
    return target

  def check_best(self) -> None:
    """A damaged ``DIR/best`` never blocks training: it is moved to ``DIR/damaged/`` with a
    warning, and the next evaluation that beats the best one logged saves a new best
    (``train.keep_best_honest``)."""
    step = self.best_step()
    if step is None:
      return
    problem = verify_checksums(epath.Path(self.best.directory) / str(step))
    if problem is None:
      try:
        self.best_score()
      except Exception as e:  # orbax/JSON raise many types for a damaged file
        problem = outage.one_line(e)
    if problem is None:
      self._add_missing_checksums(self.best, step, "its metadata")
    else:
      self._best_score = None
      target = self._quarantine(self.best, step, tag="best_")
      logging.warning(
        "The best checkpoint (step %d) is damaged: %s. Moved to %s; the next evaluation saves a "
        "new best.",
        step,
        problem,
        target,
      )

  def restore_newest_intact(
    self, restore_fn, check_fn=lambda meta: None
  ) -> tuple[int | None, Any, dict[str, Any] | None]:
    """``(step, restore_fn(step), meta)`` for the newest step that verifies, or ``(None, None,
    None)`` when nothing is saved.

    A step is damaged when its checksums mismatch, its metadata or state fails to restore, or
    ``restore_fn`` raises ``DamagedCheckpointError`` (e.g. a non-finite state). Damaged steps newer
    than the chosen one are named in one warning and moved to ``DIR/damaged/``, so that rotation
    never deletes the intact older steps. With no intact step, raises and moves nothing.
    ``check_fn(meta)`` (compatibility) runs on the first readable metadata; its errors propagate.
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    if not steps:
      return None, None, None
    damaged: list[tuple[int, str]] = []
    for step in steps:
      problem = verify_checksums(self.directory / str(step))
      if problem is None:
        try:
          meta = self.saved_meta(step)
        except Exception as e:  # a damaged metadata file: orbax/JSON raise many types
          problem = f"metadata unreadable ({outage.one_line(e)})"
      if problem is None:
        check_fn(meta)  # an incompatible config is an error, not damage
        try:
          state = restore_fn(step)
        except DamagedCheckpointError as e:
          problem = str(e)
        except Exception as e:  # TensorStore, orbax structure and I/O errors
          problem = f"restore failed ({outage.one_line(e)})"
      if problem is None:
        break
      damaged.append((step, problem))
    else:
      raise NoIntactCheckpointError(
        f"No intact checkpoint in {self.directory}: "
        + "; ".join(f"step {s}: {p}" for s, p in damaged)
        + ". Nothing was moved or deleted; restore the files, or start afresh in a new --workdir."
      )
    if damaged:
      for s, _ in damaged:
        self._quarantine(self.manager, s)
      logging.warning(
        "Damaged checkpoints skipped: %s. Resuming from step %d; the damaged steps were moved to "
        "%s.",
        "; ".join(f"step {s}: {p}" for s, p in damaged),
        step,
        self.directory / DAMAGED,
      )
    self._add_missing_checksums(self.manager, step, "its metadata and state, which is finite")
    return step, state, meta

  def _add_missing_checksums(self, manager, step: int, verified: str) -> None:
    """Writes the manifest of a committed ``step`` that has none (a synchronous save stopped before
    hashing it, or an older locvit) once ``verified`` passed: no committed step stays unverified."""
    step_dir = epath.Path(manager.directory) / str(step)
    if jax.process_index() != 0 or (step_dir / CHECKSUMS).exists():
      return
    write_checksums(step_dir)
    logging.warning(
      "Checkpoint step %d had no %s (its run stopped before hashing it); orbax read "
      "%s, and its %s is now written.",
      step,
      CHECKSUMS,
      verified,
      CHECKSUMS,
    )

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores ``state`` into the shardings of ``abstract_state`` (any mesh)."""
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
    return self.manager.restore(step, args=args)["state"]

  def check_for_errors(self, step: int) -> None:
    """Raises ``CheckpointSaveError`` at ``step`` when an asynchronous save has failed in the
    background, so that a run never trains on without checkpoints."""
    for manager in (self.manager, self.best):
      if manager is None:
        continue
      try:
        manager.check_for_errors()
      except Exception as e:  # orbax re-raises the writer thread's error, of any type
        raise self._save_error(manager, step, e) from e

  def reached_preemption(self, step: int) -> bool:
    """Whether every process stops at ``step`` (JAX's multi-host preemption sync point); False
    single-process. Only the training loop asks JAX, at every step, in order
    (``_CheckpointManager``)."""
    if jax.process_count() == 1 or not ocp.multihost.reached_preemption(step):
      return False
    for manager in (self.manager, self.best):
      if manager is not None:
        manager.preemption_step = step
    return True

  def wait(self) -> None:
    """Blocks until every asynchronous save (last-N and best) has been committed."""
    for manager in (self.manager, self.best):
      if manager is None:
        continue
      pending = self._manifests["best" if manager is self.best else "last"].step
      pending = -1 if pending is None else pending
      try:
        with outage.doing(self.watch, f"the checkpoint save of step {pending}"):
          manager.wait_until_finished()
      except Exception as e:  # the writer thread's error, of any type
        raise self._save_error(manager, pending, e) from e

  def close(self) -> None:
    """Waits for pending saves and releases both managers."""
    if not self.read_only:
      self.wait()
    self.manager.close()
    if self.best is not None:
      self.best.close()


class _Manifest:
  """Writes ``checksums.json`` into the step being saved (``step``), from orbax's save thread
  once every process has written the step and before it is committed (``AsyncOptions``'
  ``post_finalization_callback``): the manifest is committed with the step, and hashing a step in a
  slow bucket never stalls the training loop. A synchronous manager's saves are hashed by the
  caller once committed."""

  def __init__(self, directory: epath.Path):
    self.directory = epath.Path(directory)
    self.step: int | None = None  # set before each save; orbax saves one step at a time
    self.in_background = True
    self.on_written: Callable[[int], None] | None = None  # ``Checkpointer.on_saved``

  def write(self, step_dir: epath.Path) -> None:
    if jax.process_index() == 0:
      write_checksums(step_dir)
      if self.on_written is not None:
        self.on_written(self.step)

  def __call__(self) -> None:
    # Where orbax stages the step: a temporary directory renamed at commit, or (object stores,
    # CommitFileTemporaryPath) the step's own directory, committed by commit_success.txt.
    staged = self.directory / f"{self.step}{ocp.path.atomicity.TMP_DIR_SUFFIX}"
    self.write(staged if staged.is_dir() else self.directory / str(self.step))


class CheckpointSaveError(OSError):
  """A checkpoint could not be written (disk full, bucket not writable, ...)."""


class DamagedCheckpointError(ValueError):
  """Raised by a restore function when what it read is unusable (e.g. non-finite values)."""
