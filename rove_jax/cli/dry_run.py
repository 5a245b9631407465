"""rove-train --config.dry_run=True: compile the configured train step ahead of time for this
machine's devices or a named slice (--config.dry_run_topology) with rove_jax.aot, and print
its memory, FLOPs and collectives. Nothing is trained or written."""

import os
import sys
import threading
import time
from typing import Callable, Optional

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


GiB = 2**30


def host_memory_bytes() -> Optional[int]:
  """This host's memory: the physical memory, or the cgroup's limit when that is lower (a
  container's share); None where neither can be read."""
  try:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    total = None
  for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    try:
      with open(limit_file) as f:
        limit = int(f.read().strip())
    except (OSError, ValueError):  # absent, or "max": no limit
      continue
    if total is None or limit < total:
      total = limit
  return total


def local_capacity() -> tuple[Optional[int], str, bool]:
  """(bytes, what they are, shared by all local devices) for a dry run compiled for this
  machine's own devices: a GPU's memory limit, or the host's memory for CPU devices, which all
  share it."""
  import jax

  device = jax.local_devices()[0]
  if device.platform == "cpu":
    return host_memory_bytes(), "this host's memory", True
  stats = device.memory_stats() or {}
  return stats.get("bytes_limit"), f"a {device.device_kind}'s memory", False


def verdict(report: dict, capacity: Optional[int], what: str, shared: bool) -> tuple[bool, str]:
  """(fits, one line) for a compiled report on local devices: the step's memory a device
  (times the devices, when they share `capacity`) against `capacity`."""
  per_device, n = report["memory"]["total"], report.get("devices", 1)
  need = per_device * n if shared else per_device
  detail = (
    f"{per_device / GiB:.2f} GiB a device x {n} devices = {need / GiB:.2f} GiB"
    if shared and n > 1
    else f"{need / GiB:.2f} GiB"
  )
  if capacity is None:
    return True, f"verdict: unknown: the step needs {detail}; {what} could not be read"
  fits = need <= capacity
  return fits, (
    f"{'verdict: fits' if fits else 'the train step does not fit'} {what}: it "
    f"needs {detail} of {capacity / GiB:.2f} GiB"
  )


def run(c) -> int:
  """--config.dry_run=True: compile the train step of `c` (as rove-train resolved it) for this
  machine's devices (or --config.dry_run_topology) and print its figures and a verdict; exit 0
  if it fits the device's memory (for CPU devices, this host's), 1 if not. Nothing is trained
  or written."""
  from rove_jax.aot import compile as aot  # loads the compiler's machinery: this flag only

  topology = c.dry_run_topology or "local"
  with Elapsed("compiling"):
    report = aot.compile_job(c, topology, "train", log=_log, resolved=True)  # by rove-train
  print(aot.format_report(report))
  fix = (
    "a smaller data.batch_size or data.seq_len, a larger optim.grad_accum or fsdp axis, "
    "model.remat=full; python -m bench.aot --recommend proposes a mesh"
  )
  if report.get("fits") is False:
    return fail(
      f"the train step does not fit a device of {report['topology']}: see above ({fix})", 1
    )
  if report.get("fits"):
    print(
      f"verdict: fits a device of {report['topology']}: "
      f"{report['memory']['total'] / GiB:.2f} GiB of {report['hbm_bytes'] / GiB:.2f} GiB"
    )
    return 0
  if c.dry_run_topology:  # a named slice without a memory figure: nothing to compare with
    print(f"verdict: unknown: {report['topology']} has no memory figure to compare with")
    return 0
  fits, line = verdict(report, *local_capacity())
  if not fits:
    return fail(f"{line}; training would run out of memory ({fix})", 1)
  print(line)
  return 0
