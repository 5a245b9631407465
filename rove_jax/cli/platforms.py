"""Which JAX platforms a command starts on a machine with an accelerator plugin installed but no
accelerator attached.

With libtpu installed (the `[tpu]` extra, for ahead-of-time compiles), JAX tries the TPU
backend first on every machine and libtpu prints its failures ("Failed to find host bounds for
accelerator type", "unexpected worker hostname") before JAX falls back to the CPU. With a CUDA
plugin installed (the `[gpu-aot]` extra, for deviceless H100/H200 compiles) and no GPU, JAX
tries to start the plugin and prints its traceback ("Unable to load CUDA. Is it installed?").
The commands call `skip_absent_accelerators` before JAX starts a backend: where the plugins
installed have no device file (/dev/accel*, /dev/vfio/N for a TPU; /dev/nvidia0.. for a GPU),
JAX_PLATFORMS is set to "cpu" and nothing is printed. It changes nothing where the user set
JAX_PLATFORMS, where an accelerator of an installed plugin is attached, where no plugin is
installed, and not for a dry run compiled for a named slice, which needs the plugin's compiler.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import MutableMapping, Optional

# The device files a Cloud TPU VM exposes: /dev/accel* (v2-v5e), /dev/vfio/* (v5p, v6e).
TPU_DEVICE_GLOBS = ("accel*", "vfio/[0-9]*")
GPU_DEVICE_GLOBS = ("nvidia[0-9]*",)  # one per NVIDIA GPU (not nvidiactl, nvidia-uvm)
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def tpu_attached(dev: str = "/dev") -> bool:
  return any(glob.glob(os.path.join(dev, pattern)) for pattern in TPU_DEVICE_GLOBS)


def gpu_attached(dev: str = "/dev") -> bool:
  return any(glob.glob(os.path.join(dev, pattern)) for pattern in GPU_DEVICE_GLOBS)


def _installed(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def skip_absent_accelerators(
  environ: Optional[MutableMapping[str, str]] = None, *, dev: str = "/dev"
) -> Optional[str]:
  """Sets environ["JAX_PLATFORMS"] = "cpu" where libtpu or a CUDA plugin is installed and no
  accelerator of an installed one is attached, unless JAX_PLATFORMS is set already; returns
  what it set (None: nothing). Call it before JAX starts a backend."""
  environ = os.environ if environ is None else environ
  if environ.get("JAX_PLATFORMS"):
    return None
  tpu = _installed("libtpu")
  cuda = any(_installed(p) for p in CUDA_PLUGINS)
  if not (tpu or cuda) or (tpu and tpu_attached(dev)) or (cuda and gpu_attached(dev)):
    return None
  environ["JAX_PLATFORMS"] = "cpu"
  if "jax" in sys.modules and environ is os.environ:  # jax read the variable when imported
    sys.modules["jax"].config.update("jax_platforms", "cpu")
  return "cpu"


def prepare_gpu_compile(
  topology: str, environ: Optional[MutableMapping[str, str]] = None, gpus=("h100", "h200")
) -> bool:
  """For a dry run compiled for a named NVIDIA topology (h200-8, ...): sets
  JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 unless set, without which the CUDA plugin, finding no
  driver, does not register (rove_jax/aot/gpu.py). Returns whether the topology is a GPU's."""
  environ = os.environ if environ is None else environ
  if not topology.lower().startswith(tuple(f"{g}-" for g in gpus)):
    return False
  environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  return True
