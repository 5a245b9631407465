"""The one place a kernel is chosen for an attention call, and its limits checked.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, D head dim.

Kernels, by name: "xla" (jax.nn.dot_product_attention), "cudnn" (cuDNN flash attention on a CUDA
GPU, bfloat16/float16), "splash" (the Pallas splash flash kernel on TPU; Pallas interpret mode
elsewhere), "chunked" (blockwise online softmax in pure JAX, memory O(T * chunk)), "reference"
(materialised einsum, for tests), "fused" (a Pallas flash kernel that rotates q, k, v and the
output inside: on TPU rove_jax.kernels.fused (Mosaic), on a Hopper GPU (sm90)
rove_jax.kernels.fused_hopper (Mosaic GPU), on other GPUs rove_jax.kernels.fused_gpu (Triton), on
CPU the TPU kernel in Pallas interpret mode; the chosen kernel's own limits are checked) and
"auto", which picks one per call (never "fused", which has run on neither a TPU nor a GPU yet):

  - TPU: "splash" where it can run the call (an `ordered` mask without kv_valid, window or
    bias, lengths that are multiples of 128); "xla" otherwise (decoding steps, general
    positions);
  - GPU: "cudnn" for an `ordered` mask without kv_valid or window, in bfloat16/float16, head dim
    <= 128 and a multiple of 8, no bias; "xla" otherwise;
  - CPU: "chunked" from AUTO_CHUNKED_MIN_KV keys on (memory linear in length), else "xla".

`select` returns a kernels.Kernel, called with one kernels.KernelCall (rove_jax.kernels.call).
Every kernel but "fused" takes rotated inputs; "fused" rotates inside (its `rotates` is true),
so only rope_attention, rove_attention and rove_attention_rotated can call it (they pass their
Rope to `choose` and `select`).

`fallback=True` is the GPT's policy for its configured kernel: the kernels that mask by index
("splash", "fused") hand a call whose mask is not `ordered` (a decoding step against a KV cache,
general positions) to "xla" instead of refusing it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax.numpy as jnp

from rove_jax.kernels import chunked, platform, reference, xla
from rove_jax.kernels.call import Kernel

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "chunked", "reference", "fused")
# The names of kernels that rotate inside, for checks made before any call (configs); a call
# asks the Kernel itself (Kernel.rotates).
ROTARY = ("fused",)
# Kernels that mask by index, handed to "xla" under fallback=True when the mask is not ordered.
_BY_INDEX = ("splash", "fused")
# "auto" on CPU picks the chunked kernel (memory linear in length) from this many keys.
AUTO_CHUNKED_MIN_KV = 8192
CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))  # cuDNN flash runs in these
# The Hopper fused kernel's variants (GPTConfig.fused_variant): "default", or features joined by
# "+", each one of fused_hopper.kernel's arguments (its docstring says what they do).
FUSED_FEATURES = {
  "2wg": ("compute_wgs", 2),  # two compute warpgroups a forward program
  "tma": ("producer", True),  # with 2wg: a producer warpgroup copies (and turns) key blocks
  "bwd2wg": ("backward_wgs", 2),  # two warpgroups a dq and a dk, dv program
  "bwdtma": ("backward_producer", True),  # with bwd2wg: a producer warpgroup there too
  "bf16": ("bf16_turns", True),  # tiles turned in bfloat16 pairs
  "matrix": ("slice_swap", False),  # pairs swapped by the swap-matrix product, not slices
}


def choose(
  name: str,
  *,
  q,
  k,
  mask,
  bias: bool = False,
  platform_name: Optional[str] = None,
  rope=None,
  fallback: bool = False,
) -> str:
  """The kernel `name` stands for in one call: itself, or for "auto" the platform's choice
  (module docstring). Raises ValueError when it cannot run the call.

  Args:
    name: one of IMPLEMENTATIONS.
    q, k: the call's queries [B, T, H, D] and keys [B, S, K, D] (arrays or shape-dtype structs).
    mask: its kernels.Mask.
    bias: whether it adds a logit bias.
    platform_name: "cpu", "gpu" or "tpu"; None: `platform.target_platform()`.
    rope: the call's rotary.Rope, None for attention without rotation (masked_attention);
      read by "fused" only.
    fallback: "splash" and "fused" hand a mask that is not `ordered` to "xla" (module
      docstring).
  """
  if name not in IMPLEMENTATIONS:
    raise ValueError(
      f"unknown attention implementation {name!r}; expected one of {IMPLEMENTATIONS}"
    )
  if fallback and name in _BY_INDEX and not mask.ordered:
    return "xla"
  where = platform.target_platform() if platform_name is None else platform_name
  if name == "fused":
    reason = (
      "it adds no logit bias"
      if bias
      else _fused(where).problem(q.shape, k.shape, mask, rope, q.dtype)
    )
    if reason is not None:
      raise ValueError(
        f"kernel='fused' cannot run this call: {reason}; use 'auto' or "
        f"{'cudnn' if where == 'gpu' else 'splash'!r}"
      )
    return name
  if name not in ("auto", "cudnn", "splash"):
    return name
  D, half = q.shape[3], jnp.dtype(q.dtype) in CUDNN_DTYPES
  if name == "auto" and where == "tpu":
    return "splash" if _splash().problem(q.shape, k.shape, mask, bias) is None else "xla"
  if name == "auto" and where == "gpu":
    plain = mask.ordered and mask.kv_valid is None and mask.window is None and not bias
    return "cudnn" if plain and half and D <= 128 and D % 8 == 0 else "xla"
  if name == "auto":
    return "chunked" if k.shape[1] >= AUTO_CHUNKED_MIN_KV else "xla"
  if name == "cudnn" and where != "gpu":
    raise ValueError(
      f"kernel='cudnn' needs a CUDA GPU but the target platform here is "
      f"{where!r}; use 'auto', 'xla' or 'chunked'"
    )
  if name == "cudnn" and not half:
    raise ValueError(
      f"kernel='cudnn' runs in bfloat16/float16, got q.dtype={q.dtype}; cast q, "
      f"k, v (e.g. the model's dtype='bfloat16')"
    )
  reason = None if name == "cudnn" else _splash().problem(q.shape, k.shape, mask, bias)
  if reason is not None:
    raise ValueError(
      f"kernel='splash' cannot run this call: {reason}; use 'auto' (falls back "
      f"to 'xla') or 'chunked'"
    )
  return name


class Settings(NamedTuple):
  """The settings of the kernels that take some, each read only by its kernel."""

  chunk_size: int = chunked.DEFAULT_CHUNK  # "chunked": the block length
  fused_variant: str = "default"  # "fused" on a Hopper GPU: its variant (fused_options)


def fused_options(variant: str) -> dict:
  """fused_hopper.kernel's keyword arguments for a variant name (FUSED_FEATURES), e.g.
  "2wg+tma+bf16" -> {compute_wgs: 2, producer: True, bf16_turns: True}; "default" -> {}."""
  if not isinstance(variant, str):
    raise ValueError(f"a fused variant is a string, got {variant!r}")
  if variant == "default":
    return {}
  names = variant.split("+")
  unknown = [n for n in names if n not in FUSED_FEATURES]
  if unknown or len(set(names)) != len(names):
    raise ValueError(
      f"fused variant {variant!r}: expected 'default' or distinct features joined by '+' "
      f"from {tuple(FUSED_FEATURES)}, e.g. '2wg+tma+bf16'"
    )
  if "tma" in names and "2wg" not in names:
    raise ValueError(f"fused variant {variant!r}: 'tma' (a producer warpgroup) needs '2wg'")
  if "bwdtma" in names and "bwd2wg" not in names:
    raise ValueError(f"fused variant {variant!r}: 'bwdtma' needs 'bwd2wg'")
  if "bf16" in names and "matrix" in names:
    raise ValueError(f"fused variant {variant!r}: 'bf16' turns by slices, 'matrix' by none")
  return dict(FUSED_FEATURES[n] for n in names)


def select(
  name: str,
  *,
  q,
  k,
  mask,
  bias: bool = False,
  rope=None,
  fallback: bool = False,
  settings: Settings = Settings(),
) -> Kernel:
  """The kernel for one call: `choose`'s kernel (arguments as there) in its `settings`: the
  chunked one with blocks of settings.chunk_size, the Hopper fused one in
  settings.fused_variant (fused_options; a variant other than "default" is refused where
  "fused" runs another kernel)."""
  where = platform.target_platform()
  name = choose(
    name, q=q, k=k, mask=mask, bias=bias, rope=rope, platform_name=where, fallback=fallback
  )
  if name == "fused":
    module = _fused(where)
    variant = settings.fused_variant
    options = fused_options(variant)
    if options and not (where == "gpu" and platform.gpu_is_hopper()):
      raise ValueError(
        f"fused variant {variant!r} is the Hopper (sm90) kernel's, but 'fused' here runs "
        f"{module.__name__} (target {where}); set the variant to 'default'"
      )
    attend = module.kernel(**options).attend if options else module.attend
    return Kernel(name, attend, rotates=True, half_pairs=module.HALF_PAIRS)
  if name == "chunked":
    return chunked.kernel(settings.chunk_size)
  if name == "splash":
    return Kernel(name, _splash().attend)
  attend = {"reference": reference.attend, "xla": xla.attend, "cudnn": xla.attend_cudnn}[name]
  return Kernel(name, attend)


def _splash():
  """rove_jax.kernels.splash, imported on first use: Pallas takes a while to import, and only
  TPU runs and explicit "splash" calls need it. (splash imports only kernels.platform, so this
  is no import cycle.)"""
  from rove_jax.kernels import splash

  return splash


def _fused(where: str):
  """The fused kernel's module for a platform, imported on first use like splash (they import
  only kernels.platform, kernels.mesh and the fused_* modules): rove_jax.kernels.fused_hopper
  (Pallas on Mosaic GPU: wgmma and TMA) for a Hopper GPU (platform.gpu_is_hopper),
  rove_jax.kernels.fused_gpu (Pallas on Triton) for other GPUs, rove_jax.kernels.fused (Pallas
  on Mosaic TPU; interpret mode on CPU) otherwise."""
  if where == "gpu" and platform.gpu_is_hopper():
    from rove_jax.kernels import fused_hopper

    return fused_hopper
  if where == "gpu":
    from rove_jax.kernels import fused_gpu

    return fused_gpu
  from rove_jax.kernels import fused

  return fused
