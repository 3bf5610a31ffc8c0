"""A slow bucket for tests and benchmarks: a TCP proxy on loopback that holds each HTTP request
for a fixed delay before passing it on (a far region, a congested link).

Run as ``python benchmarks/slow_proxy.py TARGET_PORT DELAY_S [PORT [CUT_AT]]`` (prints ``port N``
once listening), or use ``slow_proxy(target_url, delay)`` to get the proxy's URL for as long as the
block runs; ``Outage`` makes a network outage in front of a server that keeps running, begun by
the test or by the first request that names a given object. A
request is the first bytes a client sends after the server's last reply on that connection, so
keep-alive connections are held once per request, not once per connection.

``timed_quickstart`` and ``progress_gaps`` measure what a user sees: the gaps between progress
lines of the quickstart training in a bucket (tests/test_bucket.py, benchmarks/slow_bucket.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

# Set while an ``Outage`` holds the proxy down: no new connection, no new request on an open one.
_DOWN = threading.Event()


def _pipe(source: socket.socket, target: socket.socket, delay: float, turn: list, side: str, cut):
  """Copies ``source`` to ``target`` (``side``: who sends, 'client' or 'server'); a client chunk
  after a server reply starts a request, which ``delay`` holds and an outage refuses (``cut``:
  whether it begins one). A request already sent is answered: GCS answers a retried upload whose
  reply was lost, fake-gcs-server does not (404), so cutting a reply would test the emulator
  rather than locvit."""
  with contextlib.suppress(OSError):
    while chunk := source.recv(1 << 16):
      if side == "client" and turn[0] != "client":
        if _DOWN.is_set() or cut(chunk):
          break
        if delay:
          time.sleep(delay)
      turn[0] = side
      target.sendall(chunk)
  for sock in (source, target):
    with contextlib.suppress(OSError):
      sock.shutdown(socket.SHUT_RDWR)


def serve(
  target_port: int, delay: float, ready=print, port: int = 0, cut_at: bytes | None = None
) -> None:
  """Accepts connections on ``port`` (0: any) forever, each piped to ``127.0.0.1:target_port``
  with ``delay``. SIGUSR1 takes it down (connections refused, open ones closed at their next
  request), SIGUSR2 brings it back on the same port; each prints ``down`` / ``up``. The first
  request that matches the regex ``cut_at`` (its first chunk: request line and headers) is
  refused and takes it down too, as SIGUSR1 does."""
  listener = [socket.create_server(("127.0.0.1", port))]
  port = listener[0].getsockname()[1]
  pending_cut = [re.compile(cut_at) if cut_at else None]
  cut_lock = threading.Lock()

  def cut(chunk: bytes) -> bool:
    with cut_lock:
      if pending_cut[0] is None or not pending_cut[0].search(chunk):
        return False
      pending_cut[0] = None
    _DOWN.set()  # this request and any other from now on; the main thread closes the listener
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
    return True

  def down(*_):
    _DOWN.set()
    listener[0].close()
    ready("down")

  def up(*_):
    listener[0] = socket.create_server(("127.0.0.1", port))
    _DOWN.clear()
    ready("up")

  signal.signal(signal.SIGUSR1, down)
  signal.signal(signal.SIGUSR2, up)
  ready(f"port {port}")
  while True:
    try:
      client, _ = listener[0].accept()
    except OSError:  # down: the listener is closed until SIGUSR2
      time.sleep(0.05)
      continue
    server = socket.create_connection(("127.0.0.1", target_port))
    turn = ["server"]
    for args in ((client, server, delay, turn, "client"), (server, client, 0.0, turn, "server")):
      threading.Thread(target=_pipe, args=(*args, cut), daemon=True).start()


def _start(
  target_url: str, delay: float, port: int = 0, cut_at: str | None = None
) -> tuple[subprocess.Popen, int]:
  target_port = int(target_url.rsplit(":", 1)[1].strip("/"))
  command = [sys.executable, __file__, str(target_port), str(delay), str(port)]
  command += [cut_at] if cut_at else []
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
  line = proc.stdout.readline()
  if not line.startswith("port "):
    proc.kill()
    raise RuntimeError(f"the proxy did not start: {line!r}")
  return proc, int(line.split()[1])


def _kill(proc: subprocess.Popen) -> None:
  proc.kill()
  proc.wait(timeout=10)


@contextlib.contextmanager
def slow_proxy(target_url: str, delay: float):
  """Yields the URL of a proxy (a subprocess, stopped by pid) in front of ``target_url``."""
  proc, port = _start(target_url, delay)
  try:
    yield f"http://127.0.0.1:{port}"
  finally:
    _kill(proc)


class Outage:
  """A network outage in front of a server that keeps running: ``url`` reaches ``target_url``
  through a proxy that ``stop`` takes down (new connections refused, open ones closed at their
  next request, replies to requests already sent delivered) and ``start`` brings back on the same
  port; ``close`` ends the proxy (by pid). With ``cut_at`` (a regex), the first request that
  matches it takes the proxy down as ``stop`` does (``wait_for_cut``)."""

  def __init__(self, target_url: str, cut_at: str | None = None):
    self.proc, port = _start(target_url, 0.0, cut_at=cut_at)
    self.url = f"http://127.0.0.1:{port}"

  def wait_for_cut(self, timeout: float) -> bool:
    """Whether a request matching ``cut_at`` took the proxy down within ``timeout`` seconds."""
    if not select.select([self.proc.stdout], [], [], timeout)[0]:
      return False
    line = self.proc.stdout.readline().strip()
    if line != "down":
      raise RuntimeError(f"the outage proxy said {line!r}, not 'down'")
    return True

  def _signal(self, signum: int, answer: str) -> None:
    self.proc.send_signal(signum)
    line = self.proc.stdout.readline().strip()
    if line != answer:
      raise RuntimeError(f"the outage proxy answered {line!r}, not {answer!r}")

  def stop(self) -> None:
    self._signal(signal.SIGUSR1, "down")

  def start(self) -> None:
    self._signal(signal.SIGUSR2, "up")

  def close(self) -> None:
    _kill(self.proc)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed_quickstart(env: dict, workdir: str, args, cwd: str) -> list[tuple[float, str]]:
  """Runs the quickstart in ``workdir`` with ``env`` (a bucket's client environment) and
  ``args``; returns each stdout line with the time it arrived. Raises if the run fails."""
  full_env = {**os.environ, **env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  full_env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  command = [sys.executable, "-m", "locvit.main", "--config=quickstart", f"--workdir={workdir}"]
  proc = subprocess.Popen(
    [*command, *args],
    cwd=cwd,
    env=full_env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  lines = [(time.perf_counter(), line.rstrip("\n")) for line in proc.stdout]
  err = proc.stderr.read()
  if proc.wait(timeout=60) != 0:
    raise RuntimeError(f"the quickstart failed ({proc.returncode}):\n{err[-3000:]}")
  return lines


_WAITED = re.compile(r"([\d.]+) s of it waiting for the previous save\)")


def gaps_by_step(lines: list[tuple[float, str]], less_waiting: bool = False) -> dict[int, float]:
  """The seconds between each progress line (``step N/T ...``) and the one before, by the step
  of the later line; the first line (which includes compilation) has none. ``less_waiting``:
  less the time the line says a save waited for the previous one to be committed (orbax writes
  one step at a time: through a slow bucket, saves closer together than a commit takes wait)."""
  progress = []  # (the line's time less its stated wait, its time, its step)
  for t, line in lines:
    if line.startswith("step "):
      waited = _WAITED.search(line) if less_waiting else None
      step = int(line.split()[1].split("/")[0])
      progress.append((t - float(waited[1]) if waited else t, t, step))
  return {b[2]: b[0] - a[1] for a, b in itertools.pairwise(progress)}


def progress_gaps(
  lines: list[tuple[float, str]], less_waiting: bool = False
) -> tuple[float, int, float]:
  """``(longest gap, the step whose line ended it, span)`` in seconds (``gaps_by_step``); the
  span is from the first progress line to the last."""
  gaps = gaps_by_step(lines, less_waiting)
  step = max(gaps, key=gaps.get)
  return gaps[step], step, sum(gaps.values())


if __name__ == "__main__":
  if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
    print("usage: python benchmarks/slow_proxy.py TARGET_PORT DELAY_S [PORT [CUT_AT]]")
    sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
  port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
  cut_at = sys.argv[4].encode() if len(sys.argv) > 4 else None
  ready = lambda line: print(line, flush=True)
  serve(int(sys.argv[1]), float(sys.argv[2]), ready=ready, port=port, cut_at=cut_at)
