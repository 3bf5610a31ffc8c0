"""Does a slow bucket stall training? The quickstart on ``gs://``, direct and through a proxy adding
a delay to each request, side by side: the longest gap between two progress lines.

  python benchmarks/slow_bucket.py [--delay=0.1] [--total_steps=300] [--log_every=10]
      [--checkpoint_every=100]

Starts fake-gcs-server (benchmarks/gcs_server.py) and the proxy (benchmarks/slow_proxy.py) on
loopback, runs ``locvit.main`` with the quickstart config on CPU (8 fake devices) against each, and
prints the longest gap (and the step whose line ended it), the gap across each save, the span from
the first to the last progress line, and the ratio of each, proxy / direct (docs/reliability.md,
"A slow bucket").
"""

from __future__ import annotations

import tempfile

from absl import app, flags
from gcs_server import BUCKET, client_env, gcs_server
from slow_proxy import gaps_by_step, progress_gaps, slow_proxy, timed_quickstart

_DELAY = flags.DEFINE_float("delay", 0.1, "Seconds the proxy holds each request.")
_TOTAL = flags.DEFINE_integer("total_steps", 300, "Training steps.")
_LOG = flags.DEFINE_integer("log_every", 10, "Steps between progress lines.")
_CKPT = flags.DEFINE_integer("checkpoint_every", 100, "Steps between checkpoints.")


def main(argv):
  del argv
  args = [
    f"--config.total_steps={_TOTAL.value}",
    f"--config.log_every_steps={_LOG.value}",
    f"--config.checkpoint_every_steps={_CKPT.value}",
  ]
  results = {}
  with tempfile.TemporaryDirectory() as cwd, gcs_server() as gcs:
    url = gcs.url
    with slow_proxy(url, _DELAY.value) as proxy_url:
      for name, server in (("direct", url), ("proxy", proxy_url)):
        workdir = f"gs://{BUCKET}/{name}"
        lines = timed_quickstart(client_env(server), workdir, args, cwd)
        results[name] = progress_gaps(lines)
        saves = range(_CKPT.value, _TOTAL.value, _CKPT.value)
        after = {save: gaps_by_step(lines).get(save + _LOG.value) for save in saves}
        print(f"{name}: gap after each save: {after}", flush=True)
        for _, line in lines:  # how long each save held the loop, as the progress line says
          if "(checkpoint" in line:
            print(f"{name}: {line}", flush=True)
  print(f"quickstart, {_TOTAL.value} steps, log every {_LOG.value}, checkpoint every {_CKPT.value}")
  print(f"{'':8s}{'longest gap':>14s}{'at step':>9s}{'span':>9s}")
  for name, (gap, step, span) in results.items():
    print(f"{name:8s}{gap:12.1f} s{step:9d}{span:7.1f} s")
  (direct, _, direct_span), (proxy, _, proxy_span) = results["direct"], results["proxy"]
  print(f"ratio   {proxy / direct:12.2f}x{'':9s}{proxy_span / direct_span:7.2f}x")
  print(f"goal: longest gap through the proxy <= max(1.5 x {direct:.1f}, 3) s")


if __name__ == "__main__":
  app.run(main)
