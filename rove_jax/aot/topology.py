"""The targets of an ahead-of-time compile (rove_jax.aot.compile): a TPU slice, H100 / H200 GPUs
or this host's CPUs, named as a person would name them, and their compile-only devices.

  parse_topology("v5e-8")      accelerator types (v5e-8, v4-32, v5p-128, v6e-16; v4 and v5p
                               count TensorCores, two a chip), chip grids (v5e:2x4, v4:2x2x4),
                               h100-N / h200-N (rove_jax.aot.gpu), cpu:N (this process's first N
                               CPU devices) and "local" (the devices this process runs on)
  Topology.devices()           the devices to build a mesh from: TPU devices described by
                               jax.experimental.topologies (libtpu installed, no TPU needed),
                               compile-only GPUs, or CPU devices
  CHIPS, GPU_CHIPS (Chip)      per-chip figures: peak FLOP/s, HBM and its bandwidth, ICI / NVLink
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Optional

import jax
import numpy as np

from rove_jax import hardware
from rove_jax.aot import gpu as aot_gpu

GiB = 2**30


# ------------------------------------------------------------------------------- topologies


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip figures of a TPU generation, from the Cloud TPU system-architecture pages."""

  name: str
  accelerator: str  # accelerator-type prefix (v5e is sold as v5litepod)
  peak_flops: float  # bf16 FLOP/s
  hbm_bytes: int
  hbm_bandwidth: float  # bytes/s
  ici_bandwidth: Optional[float]  # bidirectional bytes/s a chip; None: not in the table
  cores_per_chip: int  # what the "-N" of a name counts: v4 and v5p count TensorCores
  chips_per_host: int
  grids: dict  # chips -> the slice's chip grid


_GRIDS_2D = {
  1: (1, 1),
  4: (2, 2),
  8: (2, 4),
  16: (4, 4),
  32: (4, 8),
  64: (8, 8),
  128: (8, 16),
  256: (16, 16),
}
_GRIDS_3D = {
  4: (2, 2, 1),
  8: (2, 2, 2),
  16: (2, 2, 4),
  32: (2, 4, 4),
  64: (4, 4, 4),
  128: (4, 4, 8),
  256: (4, 8, 8),
  512: (8, 8, 8),
  1024: (8, 8, 16),
  2048: (8, 16, 16),
  4096: (16, 16, 16),
}
PEAK = hardware.PEAK_BF16_FLOPS
CHIPS = {
  "v4": Chip("v4", "v4", PEAK["v4"], 32 * GiB, 1200e9, None, 2, 4, _GRIDS_3D),
  "v5e": Chip("v5e", "v5litepod", PEAK["v5e"], 16 * GiB, 819e9, 400e9, 1, 8, _GRIDS_2D),
  "v5p": Chip("v5p", "v5p", PEAK["v5p"], 95 * GiB, 2765e9, 1200e9, 2, 4, _GRIDS_3D),
  "v6e": Chip("v6e", "v6e", PEAK["v6e"], 32 * GiB, 1638e9, 800e9, 1, 8, _GRIDS_2D),
}
_ALIASES = {"v5litepod": "v5e"}
# NVIDIA GPUs (rove_jax.aot.gpu): "h100-8" is 8 GPUs, hosts of 8 beyond that.
GPU_CHIPS = {
  g.name: Chip(
    g.name,
    g.name,
    g.peak_bf16,
    g.memory_bytes,
    g.memory_bandwidth,
    g.nvlink_bandwidth,
    1,
    aot_gpu.GPUS_PER_HOST,
    {},
  )
  for g in aot_gpu.GPUS.values()
}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A compile target: its canonical name, its chip (None for cpu:N) and its device grid."""

  name: str  # canonical: "v5e:2x4" or "cpu:8"
  chip: Optional[Chip]  # None for cpu:N
  grid: tuple

  @property
  def n_devices(self) -> int:
    return int(np.prod(self.grid))

  @property
  def accelerator_type(self) -> str:
    if self.chip is None:
      return self.name
    return f"{self.chip.accelerator}-{self.n_devices * self.chip.cores_per_chip}"

  def devices(self) -> list:
    """The topology's devices: compile-only TPU or GPU devices, this process's CPU devices
    (cpu:N) or all of its devices ("local")."""
    if self.name == "local":
      return jax.devices()
    if self.chip is not None and self.chip.name in GPU_CHIPS:
      return aot_gpu.devices(aot_gpu.GPUS[self.chip.name], self.n_devices)
    if self.chip is None:
      cpus = jax.devices("cpu")
      if len(cpus) < self.n_devices:
        raise ValueError(
          f"topology {self.name} needs {self.n_devices} CPU devices but this "
          f"process has {len(cpus)}; set XLA_FLAGS=--xla_force_host_platform_"
          f"device_count={self.n_devices} before JAX starts"
        )
      return cpus[: self.n_devices]
    return list(_tpu_devices(self))


def known_topologies() -> list[str]:
  """The names parse_topology takes, one pattern a generation."""
  sizes = lambda c: ",".join(str(n * c.cores_per_chip) for n in c.grids)
  return [f"{c.name}-{{{sizes(c)}}}" for c in CHIPS.values()] + [
    "v5e:AxB, v6e:AxB, v4:AxBxC, v5p:AxBxC (chip grids)",
    "h100-N, h200-N (N GPUs: 1-8 or a multiple of 8)",
    "cpu:N",
    "local",
  ]


def parse_topology(name) -> Topology:
  """ "v5e-8", "v4-32", "v5e:2x4", "v4:2x2x4", "cpu:8" (or a Topology) -> Topology."""
  if isinstance(name, Topology):
    return name
  text, chips = str(name).strip().lower(), "|".join(list(CHIPS) + list(_ALIASES))
  if m := re.fullmatch(r"cpu:(\d+)", text):
    return Topology(f"cpu:{int(m[1])}", None, (int(m[1]),))
  if text == "local":  # the devices this process runs on (a pre-flight on the job's machine)
    devices = jax.devices()
    kind = hardware.chip_name(devices[0].device_kind)
    chip = CHIPS.get(kind) or GPU_CHIPS.get(kind)
    return Topology("local", chip, (len(devices),))
  if m := re.fullmatch(rf"({'|'.join(GPU_CHIPS)})-(\d+)", text):
    aot_gpu.gpu_grid(int(m[2]))  # 1-8 or whole hosts of 8
    return Topology(f"{m[1]}-{int(m[2])}", GPU_CHIPS[m[1]], (int(m[2]),))
  m = re.fullmatch(rf"({chips})(?:-(\d+)|:(\d+(?:x\d+)+))", text)
  if not m:
    raise ValueError(f"unknown topology {name!r}; known: {'; '.join(known_topologies())}")
  chip = CHIPS[_ALIASES.get(m[1], m[1])]
  if m[2]:  # an accelerator type: v4 and v5p count TensorCores
    chips_n, rest = divmod(int(m[2]), chip.cores_per_chip)
    grid = None if rest else chip.grids.get(chips_n)
    if grid is None:
      raise ValueError(
        f"topology {name!r}: no {chip.name} slice of that size; known: "
        f"{known_topologies()[list(CHIPS).index(chip.name)]}, or give a chip "
        f"grid such as {chip.name}:{'x'.join(map(str, chip.grids[16]))}"
      )
  else:
    grid = tuple(int(d) for d in m[3].split("x"))
    if len(grid) != len(chip.grids[16]) or min(grid) < 1:
      raise ValueError(
        f"topology {name!r}: a {chip.name} chip grid has {len(chip.grids[16])} "
        f"positive sizes, e.g. {chip.name}:{'x'.join(map(str, chip.grids[16]))}"
      )
  return Topology(f"{chip.name}:{'x'.join(map(str, grid))}", chip, grid)


_DEVICE_CACHE: dict = {}


def _tpu_devices(topology: Topology):
  if topology.name in _DEVICE_CACHE:
    return _DEVICE_CACHE[topology.name]
  from jax.experimental import topologies

  chip, kwargs = topology.chip, {}
  if chip.cores_per_chip == 2:
    kwargs["chip_config_name"] = "megacore"  # one JAX device a chip, as JAX runs v4 and v5p
  if topology.n_devices <= chip.chips_per_host:  # a single host holds the whole slice
    kwargs["chips_per_host_bounds"] = (topology.grid + (1, 1))[:3]
  with _quiet_libtpu(topology):
    try:
      devices = topologies.get_topology_desc(
        topology_name=topology.name, platform="tpu", **kwargs
      ).devices
    except RuntimeError as e:
      if "not installed" in str(e):
        raise ImportError(
          f"topology {topology.name} needs libtpu to compile for TPU (no TPU "
          f"needed): pip install 'rove_jax[tpu]'"
        ) from None
      raise ValueError(f"libtpu cannot describe topology {topology.name}: {e}") from None
  _DEVICE_CACHE[topology.name] = devices
  return devices


@contextlib.contextmanager
def _quiet_libtpu(topology: Topology):
  """libtpu reads the host's TPU environment when it starts and, on a machine without a TPU,
  prints warnings for each variable it cannot determine; names for a single local host silence
  them. Variables already set win; they are restored afterwards (sharding.auto_detect_cluster
  reads them)."""
  values = {
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
    "TPU_ACCELERATOR_TYPE": topology.accelerator_type,
    "TPU_SKIP_MDS_QUERY": "1",
  }
  added = [k for k in values if k not in os.environ]
  os.environ.update({k: values[k] for k in added})
  try:
    yield
  finally:
    for k in added:
      os.environ.pop(k, None)
