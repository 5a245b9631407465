"""The platform a program is compiled for, which decides the kernels it may use."""

from __future__ import annotations

import jax


def target_platform() -> str:
  """The platform being compiled for: that of the mesh set by `jax.set_mesh` (so ahead-of-time
  compiles for a TPU topology from a CPU host choose TPU kernels), else JAX's default backend.
  "cpu", "gpu" or "tpu"."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  platform = jax.default_backend() if device is None else device.platform
  return "gpu" if platform in ("cuda", "rocm") else platform
