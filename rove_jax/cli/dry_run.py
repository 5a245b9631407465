"""rove-train --config.dry_run=True: compile the configured train step ahead of time for this
machine's devices or a named slice (--config.dry_run_topology) with rove_jax.aot, and print
its memory, FLOPs and collectives. Nothing is trained or written."""

import sys
import threading
import time
from typing import Callable

from rove_jax.cli.errors import fail

HEARTBEAT_S = 15.0  # how often the elapsed time is printed while the compiler runs


def _log(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


class Elapsed:
  """While open, prints "  ... N s" to `log` every `every` seconds, from a daemon thread: a
  compile of a large model takes minutes and prints nothing of its own."""

  def __init__(self, what: str, *, every: float = HEARTBEAT_S, log: Callable = _log):
    self.what, self.every, self.log = what, every, log
    self._done = threading.Event()
    self._start = time.perf_counter()
    self._thread = threading.Thread(target=self._beat, daemon=True)

  def _beat(self) -> None:
    while not self._done.wait(self.every):
      self.log(f"  {self.what}: {time.perf_counter() - self._start:.0f} s")

  def __enter__(self) -> "Elapsed":
    self._start = time.perf_counter()
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._done.set()
    self._thread.join()
    self.log(f"  {self.what}: done in {time.perf_counter() - self._start:.1f} s")


def run(c) -> int:
  """--config.dry_run=True: compile the configured train step for this machine's devices (or
  --config.dry_run_topology) and print its figures; exit 0 if it fits the chip's memory, 1 if
  not. Nothing is trained or written."""
  from rove_jax.aot import compile as aot  # loads the compiler's machinery: this flag only
  topology = c.dry_run_topology or "local"
  with Elapsed("compiling"):
    report = aot.compile_job(c, topology, "train", log=_log)
  print(aot.format_report(report))
  if report.get("fits") is False:
    return fail(f"the train step does not fit a device of {report['topology']}: see above "
               f"(a larger fsdp axis, optim.grad_accum or model.remat=full; python -m bench.aot "
               f"--recommend proposes a mesh)", 1)
  return 0
