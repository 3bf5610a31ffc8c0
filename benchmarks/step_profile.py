"""Where a training step's time goes, from a ``jax.profiler`` trace of a few steps.

  summary, xplane = profile_steps(run_step, wait, calls=5, log_dir=DIR)
  print_summary("DeiT-S 224 b256", summary)

``run_step()`` dispatches one step and returns at once (JAX's asynchronous dispatch); ``wait()``
blocks until the last one is done. The trace is the ``.xplane.pb`` that ``jax.profiler`` writes,
read back with ``jax.profiler.ProfileData`` (jaxlib's own reader: no TensorBoard plugin, works
offline). Device ops are, by platform:

- GPU: the events of each ``/device:GPU:N`` plane's ``Stream #...`` lines (CUPTI's record of
  every kernel, memcpy and memset; the ``CUPTI overhead`` line is left out);
- TPU: the ``XLA Ops`` line of each ``/device:TPU:N`` plane;
- CPU: the events of the host plane that carry an ``hlo_op`` stat (XLA:CPU's thunks, which run
  on several threads at once), without their ``end: ...`` markers.

Busy time is the union of the ops' intervals (ops that overlap count once); the time between
ops is the rest of the span from the first op's start to the last op's end. Host dispatch is
the duration of each step's call on the host (a ``TraceAnnotation`` around it), also from the
trace; wall time is the host's clock from the first dispatch to the end of ``wait()``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax

DISPATCH = "locvit-kit-dispatch"  # the host annotation around each step's call
TOP_OPS = 5
LONG_GAP_US = 10.0  # longer than a kernel launch: the device waited for the host
LONGEST_GAPS = 3
# CUPTI's names for a copy from the device to the host (a while loop's condition, a value read).
DEVICE_TO_HOST = re.compile(r"memcpy ?d(to|2)h|device ?-?> ?(host|pinned)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Op:
  name: str
  start_ns: float
  end_ns: float


@dataclasses.dataclass(frozen=True)
class Summary:
  steps: int
  platform: str  # where the device ops came from: 'gpu', 'tpu' or 'cpu'
  ops_per_step: float
  wall_ms: float  # per step
  busy_ms: float  # per step: the union of the ops' intervals
  between_ops_ms: float  # per step: the span's time not covered by any op
  median_gap_us: float  # the median gap between consecutive (merged) op intervals
  dispatch_ms: float  # per step: the host's call, median
  top: tuple[tuple[str, float, float], ...]  # (op name, count per step, ms per step)
  long_gaps_per_step: float = 0.0  # gaps over LONG_GAP_US
  long_gaps_ms: float = 0.0  # per step: their total
  # the LONGEST_GAPS longest gaps of the trace: (us, the op before, the op after)
  longest_gaps: tuple[tuple[float, str, str], ...] = ()
  device_to_host_per_step: float = 0.0  # copies to the host


def device_ops(profile) -> tuple[str, list[Op]]:
  """``(platform, ops)`` of a ``jax.profiler.ProfileData``, as the module docstring says."""
  planes = list(profile.planes)
  for prefix, keep in (
    ("/device:GPU:", lambda line: line.startswith("Stream #")),
    ("/device:TPU:", lambda line: line == "XLA Ops"),
  ):
    ops = [
      Op(event.name, event.start_ns, event.end_ns)
      for plane in planes
      if plane.name.startswith(prefix)
      for line in plane.lines
      if keep(line.name)
      for event in line.events
    ]
    if ops:
      return prefix.split(":")[1].lower(), sorted(ops, key=lambda op: op.start_ns)
  ops = [
    Op(event.name, event.start_ns, event.end_ns)
    for plane in planes
    if plane.name == "/host:CPU"
    for line in plane.lines
    for event in line.events
    if not event.name.startswith("end: ") and "hlo_op" in dict(event.stats)
  ]
  return "cpu", sorted(ops, key=lambda op: op.start_ns)


def host_events(profile, name: str) -> list[float]:
  """Durations (ns) of the host events called ``name``."""
  return [
    event.duration_ns
    for plane in profile.planes
    if plane.name == "/host:CPU"
    for line in plane.lines
    for event in line.events
    if event.name == name
  ]


def merged(ops: list[Op]) -> list[tuple[float, float]]:
  """The union of the ops' intervals (sorted by start), as disjoint ``(start, end)`` pairs."""
  intervals: list[list[float]] = []
  for op in ops:
    if intervals and op.start_ns <= intervals[-1][1]:
      intervals[-1][1] = max(intervals[-1][1], op.end_ns)
    else:
      intervals.append([op.start_ns, op.end_ns])
  return [(start, end) for start, end in intervals]


def gaps_between(ops: list[Op]) -> list[tuple[float, str, str]]:
  """Each time (us) inside the ops' span with no op running, with the op whose end began it and
  the op whose start ended it (``ops`` sorted by start)."""
  gaps, end, last = [], None, ""
  for op in ops:
    if end is not None and op.start_ns > end:
      gaps.append(((op.start_ns - end) / 1e3, last, op.name))
    if end is None or op.end_ns >= end:
      end, last = op.end_ns, op.name
  return gaps


def summarise(profile, steps: int, wall_s: float, steps_per_call: int = 1) -> Summary:
  """Per-step figures of a trace of ``steps`` steps, ``steps_per_call`` per host dispatch."""
  platform, ops = device_ops(profile)
  if not ops:
    raise ValueError(f"the trace holds no device ops ({[p.name for p in profile.planes]})")
  intervals = merged(ops)
  busy = sum(end - start for start, end in intervals)
  span = intervals[-1][1] - intervals[0][0]
  between = gaps_between(ops)  # (us, op before, op after)
  by_name: dict[str, list[float]] = collections.defaultdict(list)
  for op in ops:
    by_name[op.name].append(op.end_ns - op.start_ns)
  top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:TOP_OPS]
  dispatch = host_events(profile, DISPATCH)
  long_gaps = [gap for gap in between if gap[0] > LONG_GAP_US]
  return Summary(
    steps=steps,
    platform=platform,
    ops_per_step=len(ops) / steps,
    wall_ms=1e3 * wall_s / steps,
    busy_ms=busy / 1e6 / steps,
    between_ops_ms=(span - busy) / 1e6 / steps,
    median_gap_us=statistics.median(gap[0] for gap in between) if between else 0.0,
    dispatch_ms=statistics.median(dispatch) / 1e6 / steps_per_call if dispatch else float("nan"),
    top=tuple((name, len(d) / steps, sum(d) / 1e6 / steps) for name, d in top),
    long_gaps_per_step=len(long_gaps) / steps,
    long_gaps_ms=sum(gap[0] for gap in long_gaps) / 1e3 / steps,
    longest_gaps=tuple(sorted(between, key=lambda gap: -gap[0])[:LONGEST_GAPS]),
    device_to_host_per_step=sum(bool(DEVICE_TO_HOST.search(op.name)) for op in ops) / steps,
  )


def latest_xplane(log_dir: Path) -> Path:
  """The newest ``.xplane.pb`` that ``jax.profiler`` wrote under ``log_dir``."""
  paths = sorted(
    Path(log_dir).glob("plugins/profile/*/*.xplane.pb"), key=lambda p: p.stat().st_mtime
  )
  if not paths:
    raise FileNotFoundError(f"jax.profiler wrote no .xplane.pb under {log_dir}")
  return paths[-1]


def profile_steps(
  run_step: Callable[[], None], wait: Callable[[], None], calls: int, log_dir, steps_per_call=1
):
  """``(Summary, xplane path)`` of ``calls`` calls of ``run_step`` (``steps_per_call`` steps
  each) dispatched back to back under the profiler; the summary's figures are per step."""
  wait()  # nothing of earlier steps in the trace
  options = jax.profiler.ProfileOptions()
  options.python_tracer_level = 0  # no Python call events: they inflate dispatch and the trace
  jax.profiler.start_trace(str(log_dir), profiler_options=options)
  try:
    t0 = time.perf_counter()
    for call in range(calls):
      annotations = jax.profiler.StepTraceAnnotation("train", step_num=call)
      with annotations, jax.profiler.TraceAnnotation(DISPATCH):
        run_step()
    wait()
    wall_s = time.perf_counter() - t0
  finally:
    jax.profiler.stop_trace()
  path = latest_xplane(Path(log_dir))
  profile = jax.profiler.ProfileData.from_file(str(path))
  return summarise(profile, calls * steps_per_call, wall_s, steps_per_call), path


def print_summary(label: str, summary: Summary, compiled_kernels: str = "-") -> None:
  """One block: the row of per-step figures, then the top ops by time. ``compiled_kernels``: the
  step's kernels as its compiled HLO lists them (``kit.listed_kernels``)."""
  s = summary
  print(
    f"{label:<34} {s.platform:>4} {s.ops_per_step:7.0f} {s.wall_ms:9.2f} {s.busy_ms:8.2f}"
    f" {100 * s.busy_ms / s.wall_ms:5.0f}% {s.between_ops_ms:8.2f} {s.median_gap_us:8.1f}"
    f" {s.dispatch_ms:9.3f} {compiled_kernels:>9}",
    flush=True,
  )
  for name, count, ms in s.top:
    share = 100 * ms / s.busy_ms if s.busy_ms else 0.0
    print(f"    {ms:8.3f} ms {share:4.0f}% x{count:<5.0f} {name[:90]}", flush=True)
  print(
    f"    gaps over {LONG_GAP_US:.0f} us: {s.long_gaps_per_step:.1f} per step, "
    f"{s.long_gaps_ms:.3f} ms; copies to the host: {s.device_to_host_per_step:.1f} per step",
    flush=True,
  )
  for us, before, after in s.longest_gaps:
    print(f"    gap {us:8.1f} us after {before[:45]} before {after[:45]}", flush=True)


HEADER = (
  f"{'model':<34} {'src':>4} {'ops/st':>7} {'wall ms':>9} {'busy ms':>8} {'busy':>6}"
  f" {'gaps ms':>8} {'gap us':>8} {'disp. ms':>9} {'XLA list':>9}"
)
LEGEND = (
  "Per step: ops/st = device ops (GPU kernels and copies; XLA:CPU thunks on CPU); wall = host\n"
  "clock; busy = union of the ops' intervals (busy % = of wall); gaps = time between ops inside\n"
  "the ops' span; gap us = median gap; disp. = the host's dispatch call (median). Under each row\n"
  "XLA list = the kernels the compiled step lists (outside loops+in a pass of the loops' bodies;\n"
  "benchmarks/step_kernels.py). Under each row\n"
  "the top ops by time: ms per step, share of busy time, count per step, name; the gaps over\n"
  f"{LONG_GAP_US:.0f} us (the device waited for the host) and the copies to the host, per step;\n"
  "the trace's longest gaps, with the ops on either side."
)
