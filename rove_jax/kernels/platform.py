"""The platform a program is compiled for, which decides the kernels it may use."""

from __future__ import annotations

import re

import jax


def target_platform() -> str:
  """The platform being compiled for: that of the mesh set by `jax.set_mesh` (so ahead-of-time
  compiles for a TPU topology from a CPU host choose TPU kernels), else JAX's default backend.
  "cpu", "gpu" or "tpu"."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  platform = jax.default_backend() if device is None else device.platform
  return "gpu" if platform in ("cuda", "rocm") else platform


# Hopper (compute capability 9.0) by name, for compile-only targets whose devices carry only a
# device kind (an abstract mesh's device).
_HOPPER_NAMES = re.compile(r"\b(GH200|H100|H200|H800|H20)\b")


def gpu_is_hopper() -> bool:
  """Whether the GPU compiled for is a Hopper (sm90: wgmma and TMA, what
  rove_jax.kernels.fused_hopper needs): that of the mesh set by `jax.set_mesh`, else the
  first local device. False off GPU."""
  if target_platform() != "gpu":
    return False
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  if device is None:
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    if capability is not None:
      return str(capability).split(".")[0] == "9"
  return bool(_HOPPER_NAMES.search(getattr(device, "device_kind", "")))
