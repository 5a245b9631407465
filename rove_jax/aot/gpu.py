"""Compile-only NVIDIA GPUs for rove_jax.aot.compile: H100 and H200 slices from a host without
a GPU.

XLA's CUDA plugin compiles for a GPU it cannot see when it is given a GPU target description (a
`stream_executor.GpuTargetConfigProto` in text form) and a topology "<slices>x<hosts>x<gpus a
host>": `jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...,
topology=...)` then returns compile-only devices, and `jit(...).lower(...).compile()` runs the
whole GPU pipeline (LLVM, ptxas) on this host. The description is written here from the
published figures of each chip (`GPUS`); XLA uses them for tiling and fusion choices. Pallas
Triton kernels (rove_jax.kernels.fused_gpu) compile on this path too, Triton included: the
kernel is chosen at trace time for the platform of the mesh set by `jax.set_mesh`
(python -m bench.fused_gpu --aot h200).

What the host needs (the tool's error prints the command): the `[gpu-aot]` extra,
  pip install 'rove_jax[gpu-aot]'
which installs jax-cuda12-plugin and jax-cuda12-pjrt at the installed jax's version, ptxas
(nvidia-cuda-nvcc-cu12) and cuDNN (nvidia-cudnn-cu12, which jax checks when tracing it),
and JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (bench.aot sets it), or the plugin, finding no driver,
does not register. Known limits of deviceless compiles: cost_analysis() is not implemented by
the GPU plugin (FLOPs then come from XLA's HLO cost model on the CPU client, see `gpu_costs`,
which sees none in library calls: the report adds cuBLAS GEMMs' from the HLO through
rove_jax.aot.gpu_census, and attention's analytically), and cuDNN's workspace is sized when
a GPU is present, so temporaries may undercount it. jax asks the local GPU for its compute
capability when it traces cuDNN attention; `answer_capability_checks` makes the target answer.
"""

from __future__ import annotations

import dataclasses
import os

from rove_jax import hardware

GiB = 2**30
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class GpuSpec:
  """Published figures of one GPU model (NVIDIA data sheets; CUDA programming guide for
  compute capability 9.0 limits)."""

  name: str
  description: str
  sm_count: int
  clock_ghz: float
  memory_bytes: int
  memory_bandwidth: float  # bytes/s
  l2_bytes: int
  peak_bf16: float  # dense FLOP/s
  nvlink_bandwidth: float  # bidirectional bytes/s a GPU


GPUS = {
  "h100": GpuSpec(
    "h100",
    "NVIDIA H100 80GB HBM3",
    132,
    1.98,
    81559 * MiB,
    3.35e12,
    50 * MiB,
    hardware.PEAK_BF16_FLOPS["h100"],
    900e9,
  ),
  "h200": GpuSpec(
    "h200",
    "NVIDIA H200 141GB HBM3e",
    132,
    1.98,
    143771 * MiB,
    4.8e12,
    50 * MiB,
    hardware.PEAK_BF16_FLOPS["h200"],
    900e9,
  ),
}
GPUS_PER_HOST = 8


def target_config(spec: GpuSpec) -> str:
  """The GpuTargetConfigProto text XLA compiles against (compute capability 9.0 limits)."""
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {spec.sm_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(spec.memory_bandwidth)}
  l2_cache_size: {spec.l2_bytes}
  clock_rate_ghz: {spec.clock_ghz}
  device_memory_size: {spec.memory_bytes}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  cuda_compute_capability {{ major: 9 minor: 0 }}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
device_description_str: "{spec.description}"
"""


def gpu_grid(n_gpus: int) -> tuple:
  """(slices, hosts, gpus a host) for n GPUs: one host up to 8, then whole hosts of 8."""
  if n_gpus < 1 or (n_gpus > GPUS_PER_HOST and n_gpus % GPUS_PER_HOST):
    raise ValueError(
      f"{n_gpus} GPUs: use 1-{GPUS_PER_HOST} (one host) or a multiple of "
      f"{GPUS_PER_HOST} (whole hosts)"
    )
  if n_gpus <= GPUS_PER_HOST:
    return (1, 1, n_gpus)
  return (1, n_gpus // GPUS_PER_HOST, GPUS_PER_HOST)


def devices(spec: GpuSpec, n_gpus: int) -> list:
  """Compile-only devices of n GPUs of this model (needs the CUDA plugin, not a GPU)."""
  import jax
  from jax.experimental import topologies

  grid = gpu_grid(n_gpus)
  version = jax.__version__
  fix = (
    f"pip install 'rove_jax[gpu-aot]' (jax-cuda12-plugin and jax-cuda12-pjrt "
    f"=={version}, nvidia-cuda-nvcc-cu12, nvidia-cudnn-cu12), and "
    f"JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 in the environment before JAX starts"
  )
  try:
    topo = topologies.get_topology_desc(
      topology_name=f"{spec.name}-{n_gpus}",
      platform="cuda",
      target_config=target_config(spec),
      topology="x".join(map(str, grid)),
    )
  except (NotImplementedError, RuntimeError, ValueError) as e:
    skip = os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
    raise ImportError(
      f"cannot describe {n_gpus} x {spec.name} for compilation ({e}); this needs "
      f"JAX's CUDA plugin at jax {version} (no GPU needed): {fix}"
      f"{'' if skip else ' (it is unset now)'}"
    ) from None
  answer_capability_checks(spec)
  return list(topo.devices)


def answer_capability_checks(spec: GpuSpec) -> None:
  """jax's cuDNN attention asks the local GPU for its compute capability while tracing (the
  packed layout of rove_jax.kernels.xla's cuDNN kernel needs 9.0); a host without a GPU would
  answer "no". For compile-only devices the target answers: every GpuSpec here is 9.0. Patches
  jax's private module for this process, which compiles for that GPU only."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

  target = (9, 0)
  assert spec.name in GPUS  # all compute capability 9.0 (target_config)
  as_tuple = lambda capability: tuple(int(x) for x in capability.split("."))
  cudnn_fa.check_compute_capability = lambda capability: as_tuple(capability) <= target
  cudnn_fa.is_cuda_compute_capability_equal = lambda capability: as_tuple(capability) == target


def gpu_costs(compiled) -> dict:
  """{'flops', 'bytes accessed'} of a compiled GPU program from XLA's HLO cost model run by the
  CPU client (the GPU plugin does not implement cost_analysis); {} when that is unavailable.
  Uses jaxlib internals (no public API exists); a failure only loses the figures."""
  try:
    from jax._src import xla_bridge
    from jax._src.lib import _jax

    module = compiled.runtime_executable().hlo_modules()[0]
    costs = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), module)
  except Exception:  # noqa: BLE001 - private API: any change just drops the figures
    return {}
  return {k: float(v) for k, v in dict(costs).items() if k in ("flops", "bytes accessed")}
