"""The XLA options the trainer compiles its steps with on NVIDIA GPUs (none elsewhere).

  xla_gpu_enable_triton_gemm=false  matmuls go to cuBLAS/cuBLASLt instead of XLA's Triton GEMM
      emitter: NVIDIA's own tuned kernels, with bias and residual adds folded into the GEMM's
      epilogue, and no per-shape autotuning of Triton tiles at compile time (which made the
      354M step take minutes to compile on an H200);
  xla_gpu_enable_latency_hiding_scheduler=true  the scheduler overlaps collectives (the data-
      parallel gradient all-reduce, FSDP all-gathers) with compute; nothing to overlap on one GPU.

They are passed to each compilation (jax.jit's compiler_options), so they apply to the train
and evaluation steps only and need no environment set before JAX starts. A flag you set in
XLA_FLAGS wins (its name is left out here); ROVE_JAX_GPU_OPTIONS=off drops all of them.
docs/training.md says how to choose; bench/gpu_check.sh times the step with and without them.
"""

from __future__ import annotations

import os
from typing import Iterable

RECOMMENDED = {
  "xla_gpu_enable_triton_gemm": False,
  "xla_gpu_enable_latency_hiding_scheduler": True,
}
OFF_VAR = "ROVE_JAX_GPU_OPTIONS"


def compiler_options(devices: Iterable) -> dict:
  """The options for a program on `devices` (jax devices, compile-only ones included): RECOMMENDED
  on CUDA GPUs less any flag named in XLA_FLAGS; {} on other platforms or with
  ROVE_JAX_GPU_OPTIONS=off."""
  first = next(iter(devices), None)
  if first is None or first.platform not in ("gpu", "cuda"):
    return {}
  if os.environ.get(OFF_VAR, "").strip().lower() in ("off", "0", "false", "none"):
    return {}
  flags = os.environ.get("XLA_FLAGS", "")
  return {
    k: v for k, v in RECOMMENDED.items() if f"--{k}=" not in flags and f"--{k} " not in f"{flags} "
  }
