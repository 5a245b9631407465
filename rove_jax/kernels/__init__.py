"""Attention kernels: softmax(scale * q.k + bias) v over a `Mask`, with GQA, on inputs already
rotated. `select` (rove_jax.kernels.dispatch) picks one per call; rove_jax.attention wraps
them in the rotations.

  mask       Mask (which keys each query sees) and its dense [B, T, S] form
  reference  materialised einsum in float32 (float64 if given), the test reference
  xla        jax.nn.dot_product_attention: "xla", and "cudnn" with its packed-documents layout
  chunked    blockwise online softmax in pure JAX, memory O(T * chunk)
  splash     the Pallas splash flash kernel for TPU (imported when first chosen)
  fused      a Pallas flash kernel for TPU that rotates q, k, v and the output inside, forward
             and backward (fused_tiles, fused_backward; imported when first chosen)
  call       the kernel boundary: KernelCall (one call's inputs) and Kernel (attend(call), and
             whether it rotates inside)
  linear_ce  not attention: the output projection and cross-entropy in one Pallas Triton kernel
             for GPUs (the trainer's optim.loss_impl=fused; imported when chosen)
  dispatch   "auto", the kernels' limits, `select`, the Hopper fused kernel's variants
  platform   the platform being compiled for
"""

from rove_jax.kernels import chunked, platform, reference, xla
from rove_jax.kernels.call import KINDS, Kernel, KernelCall
from rove_jax.kernels.dispatch import (
  AUTO_CHUNKED_MIN_KV,
  CUDNN_DTYPES,
  FUSED_FEATURES,
  IMPLEMENTATIONS,
  ROTARY,
  Settings,
  choose,
  fused_options,
  select,
)
from rove_jax.kernels.mask import Mask
from rove_jax.kernels.platform import target_platform

__all__ = [
  "Mask",
  "Kernel",
  "KernelCall",
  "KINDS",
  "select",
  "Settings",
  "choose",
  "target_platform",
  "IMPLEMENTATIONS",
  "ROTARY",
  "AUTO_CHUNKED_MIN_KV",
  "CUDNN_DTYPES",
  "FUSED_FEATURES",
  "fused_options",
  "chunked",
  "platform",
  "reference",
  "xla",
]
