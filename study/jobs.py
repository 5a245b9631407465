"""Child processes of the study, run a few at a time, each pinned to its own CPU core.

Small models use two cores poorly from one process (XLA's threads wait on each other more than
they compute), so the study trains and evaluates them side by side instead: on Linux each
running child is pinned to one core (os.sched_setaffinity), elsewhere they share the machine.
Each child's output goes to its own log file, so that parallel progress bars do not interleave;
the parent prints one line when a child starts and one when it ends.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import NamedTuple, Optional, Sequence


class Job(NamedTuple):
  label: str
  cmd: list
  log: str  # the child's stdout and stderr
  env: Optional[dict] = None


def default_jobs() -> int:
  """Children at a time: one per core this process may use, at most 2."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count() or 1
  return max(1, min(2, cores))


def _pin(pid: int, core: Optional[int]) -> None:
  """Pins a just-started child to one core from the parent (no preexec_fn: forking a
  multithreaded parent such as one that imported JAX must not run Python in the child). The
  child is then still importing, before any thread of its own: its threads inherit the pin."""
  if core is not None and hasattr(os, "sched_setaffinity"):
    try:
      os.sched_setaffinity(pid, {core})
    except OSError:  # the child already ended, or pinning is not allowed here: unpinned
      pass


def run(jobs: Sequence[Job], n: Optional[int] = None, log=print, on_done=None) -> list:
  """Runs `jobs`, n at a time (default `default_jobs()`), in order of start; stops starting
  new ones after a failure and waits for those running. `on_done(index, exit code, seconds)`,
  when given, is called as each job ends (e.g. to record it before the others end).

  Returns:
    [(exit code, seconds)] in the order of `jobs` (None, None for a job never started).
  """
  n = default_jobs() if n is None else max(1, n)
  try:
    cores = sorted(os.sched_getaffinity(0))
  except AttributeError:
    cores = []
  pin = n > 1 and len(cores) >= n
  results: list = [(None, None)] * len(jobs)
  running: dict = {}  # slot -> (index, Popen, start, file)
  nxt, failed = 0, False
  while nxt < len(jobs) and not failed or running:
    while len(running) < n and nxt < len(jobs) and not failed:
      slot = next(s for s in range(n) if s not in running)
      job = jobs[nxt]
      os.makedirs(os.path.dirname(os.path.abspath(job.log)), exist_ok=True)
      f = open(job.log, "a")
      proc = subprocess.Popen(job.cmd, stdout=f, stderr=subprocess.STDOUT, env=job.env)
      _pin(proc.pid, cores[slot] if pin else None)
      log(f"{job.label}: started (log {job.log})")
      running[slot] = (nxt, proc, time.perf_counter(), f)
      nxt += 1
    time.sleep(0.2)
    for slot, (i, proc, t0, f) in list(running.items()):
      rc = proc.poll()
      if rc is None:
        continue
      f.close()
      secs = time.perf_counter() - t0
      results[i] = (rc, secs)
      if on_done is not None:
        on_done(i, rc, secs)
      del running[slot]
      log(f"{jobs[i].label}: {'done' if rc == 0 else f'FAILED (exit {rc})'} in {secs:.0f} s")
      if rc != 0:
        failed = True
        with open(jobs[i].log) as logf:
          tail = logf.read()[-2000:]
        log(f"--- last lines of {jobs[i].log} ---\n{tail}")
  return results
