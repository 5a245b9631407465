"""Peak dense bf16 FLOP/s of the accelerators rove-jax knows, by name, and which name a JAX
device is: the one table that MFU (training's logs, rove_jax.train.step_loop) and the ahead-of-time
reports (rove_jax.aot) divide by. Figures from the Cloud TPU system-architecture pages and
NVIDIA's data sheets (dense, without sparsity). No dependencies: any layer may read it.
"""

from __future__ import annotations

from typing import Optional

PEAK_BF16_FLOPS = {
  "v4": 275e12,
  "v5e": 197e12,
  "v5p": 459e12,
  "v6e": 918e12,  # per TPU chip
  "h100": 989e12,
  "h200": 989e12,  # per GPU (SXM)
}
# device_kind prefixes (jax.Device.device_kind) of those accelerators.
DEVICE_KINDS = {
  "TPU v4": "v4",
  "TPU v5 lite": "v5e",
  "TPU v5e": "v5e",
  "TPU v5p": "v5p",
  "TPU v5": "v5p",
  "TPU v6 lite": "v6e",
  "TPU v6e": "v6e",
  "NVIDIA H100": "h100",
  "NVIDIA H200": "h200",
}


def chip_name(device_kind: str) -> Optional[str]:
  """The table's name of a device kind ("TPU v5 lite" -> "v5e"), or None (CPUs, other GPUs)."""
  return next((v for k, v in DEVICE_KINDS.items() if device_kind.startswith(k)), None)


def peak_flops(device_kind: str) -> Optional[float]:
  """Peak bf16 FLOP/s of one device of this kind, or None when unknown (then no MFU)."""
  name = chip_name(device_kind)
  return None if name is None else PEAK_BF16_FLOPS[name]
