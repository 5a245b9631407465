"""Which JAX platforms a command starts on a machine with libtpu installed but no TPU attached.

With libtpu installed (the `[tpu]` extra, for ahead-of-time compiles), JAX tries the TPU
backend first on every machine and libtpu prints its failures ("Failed to find host bounds for
accelerator type", "unexpected worker hostname") before JAX falls back to the CPU. The commands
call `skip_absent_tpu` before JAX starts a backend: where no TPU device file exists, JAX_PLATFORMS
is set to "cpu" and nothing is printed. It changes nothing where the user set JAX_PLATFORMS,
where a TPU is attached, where libtpu is not installed, or where a CUDA plugin is (a GPU machine
keeps JAX's own choice), and not for a dry run compiled for a named slice, which needs libtpu's
compiler.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import MutableMapping, Optional

# The device files a Cloud TPU VM exposes: /dev/accel* (v2-v5e), /dev/vfio/* (v5p, v6e).
TPU_DEVICE_GLOBS = ("accel*", "vfio/[0-9]*")
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def tpu_attached(dev: str = "/dev") -> bool:
  return any(glob.glob(os.path.join(dev, pattern)) for pattern in TPU_DEVICE_GLOBS)


def _installed(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def skip_absent_tpu(environ: Optional[MutableMapping[str, str]] = None, *,
                    dev: str = "/dev") -> Optional[str]:
  """Sets environ["JAX_PLATFORMS"] = "cpu" where libtpu is installed, no TPU is attached and no
  CUDA plugin is installed, unless JAX_PLATFORMS is set already; returns what it set (None:
  nothing). Call it before JAX starts a backend."""
  environ = os.environ if environ is None else environ
  if environ.get("JAX_PLATFORMS") or not _installed("libtpu"):
    return None
  if tpu_attached(dev) or any(_installed(p) for p in CUDA_PLUGINS):
    return None
  environ["JAX_PLATFORMS"] = "cpu"
  if "jax" in sys.modules and environ is os.environ:  # jax read the variable when imported
    sys.modules["jax"].config.update("jax_platforms", "cpu")
  return "cpu"
