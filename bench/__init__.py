"""Benchmarks: alternatives measured in one process, interleaved, as medians and ratios."""

import resource
import sys


def peak_rss_gib() -> float:
  """This process's peak resident set. Linux: VmHWM of /proc/self/status, the high-water mark
  of this address space. Not ru_maxrss: Linux carries it across fork + exec, so a worker
  started by a 3 GiB parent would report at least 3 GiB whatever it used itself."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 2**20  # kB
  except OSError:
    pass
  scale = 2**30 if sys.platform == "darwin" else 2**20  # bytes on macOS, kB elsewhere
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
