"""Running Pallas Mosaic GPU kernels on a CPU, in jax's interpreter (the Hopper fused kernel's
tests and `bench.fused_gpu --interpret`): the `interpret` value a kernel is given, the CPU
thread pool a multi-warpgroup kernel needs there, and one compile of each warpgroup program.

How the interpreter runs a kernel (jax 0.10 and 0.11): a loop over the grid's points, and at
each point one thread a warpgroup, each running the kernel's body as a program of its own; the
shared memory, barriers and TMA copies among them are host callbacks. Its
`thread_map._run_jaxpr` traces, lowers and compiles that program at every call, so for every
warpgroup at every grid point (jax 0.10 makes a fresh `jax.jit` each time; jax 0.11's source
still lowers and compiles each call). `interpret_params` therefore has it compile each program
once (`compile_each_program_once`): the same program of the same argument shapes, run with the
arguments it is given, so nothing the kernel computes changes.
"""

from __future__ import annotations

import collections
import os
import threading

import jax
import numpy as np

# The environment variables that size XLA's CPU thread pools, read once when JAX starts its CPU
# client (XLA's DefaultThreadPoolSize: the first that holds a whole number, else the cores this
# process may run on).
POOL_VARIABLES = ("PJRT_NPROC", "NPROC")
# The most compiled warpgroup programs kept (each a kernel variant at one shape); the least
# recently used go first.
MAX_PROGRAMS = 64


def interpret_params():
  """The `interpret` value that runs a Mosaic GPU kernel on CPU, with each warpgroup program
  compiled once. jax 0.10 exports the class only from its private tree."""
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  compile_each_program_once()
  return InterpretGPUParams()


def cpu_pool_threads() -> tuple[int, str]:
  """(threads of XLA's CPU pool, what set them), as XLA sizes it."""
  for name in POOL_VARIABLES:
    try:
      return max(0, int(os.environ.get(name, ""))), f"{name}={os.environ[name]}"
    except ValueError:
      continue
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return cores or 1, "the cores this process may use"


def interpret_pool_problem(n: int, *, jitted: bool = False) -> str | None:
  """Why Mosaic GPU's interpreter could hang on a program of n warpgroups here, or None.
  It runs each warpgroup as a computation of its own, all at once, beside the call that waits
  for them, and their host callbacks (barrier waits among them) take threads of XLA's CPU pool:
  with fewer than n + 1, the waiting call and the warpgroups waiting on a barrier can
  hold every thread while the warpgroup that would release them never runs. jitted: the kernel
  runs inside a jitted call, whose waiting callback takes the calling thread, not the pool's,
  so n threads are enough."""
  threads, source = cpu_pool_threads()
  needed = n if jitted else n + 1
  if n == 1 or needed <= threads:
    return None
  return (
    f"Mosaic GPU interpret mode runs this kernel's {n} warpgroups at once on XLA's CPU "
    f"thread pool, which has {threads} thread(s) here ({source}), so it could hang. Set "
    f"PJRT_NPROC={needed} (or more) in the environment before JAX starts, or pick a variant "
    "with fewer warpgroups"
  )


class ProgramCache:
  """Compiled warpgroup programs by (program, argument shapes and dtypes): a stand-in for the
  interpreter's `thread_map._run_jaxpr(jaxpr, consts, *args)` that compiles a program the first
  time and runs the compiled one after. A program is compiled by one thread while the others
  that need it wait; it holds each program it keys by identity, so no key is reused."""

  def __init__(self, limit: int = MAX_PROGRAMS):
    self.limit = limit
    self.compiled = 0
    self._lock = threading.Lock()
    self._entries: collections.OrderedDict = collections.OrderedDict()

  def __call__(self, jaxpr, consts, *args) -> None:
    key = (id(jaxpr), _signature(consts), _signature(args))
    with self._lock:
      entry = self._entries.get(key)
      if entry is None:
        entry = self._entries[key] = {"jaxpr": jaxpr, "lock": threading.Lock(), "run": None}
        while len(self._entries) > self.limit:
          self._entries.popitem(last=False)
      self._entries.move_to_end(key)
    with entry["lock"]:
      if entry["run"] is None:
        traced = jax.jit(_evaluate, static_argnums=(0,)).trace(jaxpr, consts, *args)
        entry["run"] = traced.lower().compile()
        with self._lock:
          self.compiled += 1
    entry["run"](consts, *args)

  def __len__(self) -> int:
    return len(self._entries)


def _evaluate(jaxpr, consts, *args):
  jax.core.eval_jaxpr(jaxpr, consts, *args)


def _signature(values) -> tuple:
  arrays = [v if hasattr(v, "dtype") else np.asarray(v) for v in jax.tree.leaves(values)]
  return tuple((tuple(a.shape), str(a.dtype)) for a in arrays)


_INSTALLED: ProgramCache | None = None


def compile_each_program_once() -> ProgramCache | None:
  """Puts a ProgramCache in place of the interpreter's per-call compile (once a process), and
  returns it; None where this jax has no `thread_map._run_jaxpr(jaxpr, consts, *args)` to
  replace (the interpreter then compiles as it does, and runs as slowly)."""
  global _INSTALLED
  if _INSTALLED is not None:
    return _INSTALLED
  try:
    from jax._src.pallas.mosaic.interpret import thread_map
  except ImportError:
    return None
  if not callable(getattr(thread_map, "_run_jaxpr", None)):
    return None
  _INSTALLED = ProgramCache()
  thread_map._run_jaxpr = _INSTALLED
  return _INSTALLED
