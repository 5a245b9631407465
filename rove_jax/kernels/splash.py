"""The splash kernel: TPU flash attention, softmax(scale * q.k) v under a causal and/or segment
mask, via jax.experimental.pallas.ops.tpu.splash_attention.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, D head dim.

Splash is a Pallas/Mosaic kernel for TPU: blockwise online softmax that skips the blocks a static
mask (here splash's CausalMask) hides, so memory is O(T * block) and causal work halves. Off TPU
it runs in Pallas interpret mode (same numerics, slow), which is how the tests check it on CPU.

How the kernel is driven here:
  * One MHA splash kernel per call shape, vmapped over the batch (splash kernels are
    per-example: [H, T, D] queries, [K, S, D] keys/values). Splash's MHA kernel handles GQA/MQA
    itself (query head h reads kv head h // (H // K)), so k and v are never repeated.
  * Splash takes no logit scale: q is multiplied by `scale` in float32 and cast back to q.dtype
    (exact for D = 64's 1/8 in any dtype; one extra rounding of q in bfloat16 otherwise).
  * Head dim: any D (the installed JAX's splash pads q/k/v head dims to TPU lanes internally and
    its TPU tests cover D = 64), so no padding here.
  * Lengths must be multiples of 128 (the TPU lane width every splash block is a multiple of).
    Blocks: the largest multiple of 128 that divides the length, at most block_size (512).
  * Masks by index, not by position: the call's Mask must be `ordered` (query i and kv i at the
    same position, positions growing with the index in each segment), with no kv_valid, no
    window and no bias; positions are not read. Segment ids go to splash's SegmentIds. Splash
    gives a row that sees no key the mean of the values it scanned instead of 0; such rows (only
    possible with distinct q/kv segment ids) are zeroed.
  * Under an active mesh (jax.set_mesh) the kernel runs in jax.shard_map with the batch split
    over ("data", "fsdp") and heads over "tensor", because GSPMD cannot partition a Mosaic
    custom call. Axes that do not divide a dim, and other mesh axes, are left out (replicated).
    Splash's outputs carry no varying-axes annotation, so an enclosing jax.shard_map needs
    check_vma=False.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.sharding import PartitionSpec as P

from rove_jax.kernels import mesh, platform
from rove_jax.kernels.call import Kernel, KernelCall

LANES = 128  # TPU lane width: every splash block (and so every length) is a multiple of it
DEFAULT_BLOCK = 512


def unsupported_reason(T: int, S: int, H: int, K: int, D: int, *, causal: bool) -> str | None:
  """None when splash can run these shapes; otherwise a one-line reason."""
  if min(T, S, H, K, D) < 1:
    return f"every size must be positive, got T={T}, S={S}, H={H}, K={K}, D={D}"
  if H % K:
    return f"query heads H={H} are not a multiple of kv heads K={K}"
  if causal and T != S:
    return (
      f"causal splash attention is index-causal and needs T == S (self-attention), got T={T}, S={S}"
    )
  for name, n in (("query length T", T), ("kv length S", S)):
    if n % LANES:
      return f"{name}={n} is not a multiple of {LANES} (splash's smallest block); pad it"
  return None


def problem(q_shape, k_shape, mask, bias: bool) -> str | None:
  """None when splash can run a call (q [B, T, H, D], k [B, S, K, D], a kernels.Mask, with or
  without a logit bias); otherwise the reason, for an error message or a fallback."""
  if not mask.ordered:
    return (
      "splash masks by index: it needs a Mask with ordered=True (positions that grow "
      "with the index, T == S)"
    )
  if mask.kv_valid is not None or mask.window is not None or bias:
    return "splash takes no kv_valid, window or bias"
  (_, T, H, D), (_, S, K, _) = q_shape, k_shape
  return unsupported_reason(T, S, H, K, D, causal=mask.causal)


def kernel(block_size: int = DEFAULT_BLOCK, interpret: Optional[bool] = None) -> Kernel:
  """The splash kernel, on rotated inputs (kernels.call; positions unread, see the module
  docstring).

  Args:
    block_size: largest q/kv block, a multiple of 128; the blocks used are the largest
      multiples of 128 that divide T and S and do not exceed it.
    interpret: Pallas interpret mode; None: on unless compiling for TPU (the mesh's platform
      under jax.set_mesh, else JAX's default backend; see platform.target_platform).
  """
  if (
    isinstance(block_size, bool)
    or not isinstance(block_size, int)
    or (block_size < LANES or block_size % LANES)
  ):
    raise ValueError(f"block_size must be a positive multiple of {LANES}, got {block_size!r}")

  def attend(call: KernelCall) -> jax.Array:
    mask, scale, bias_fn = call.mask, call.scale, call.bias_fn
    q_BTHD, k_BSKD, v_BSKD = (jnp.asarray(x) for x in (call.q_BTHD, call.k_BSKD, call.v_BSKD))
    if q_BTHD.ndim != 4 or k_BSKD.ndim != 4 or k_BSKD.shape != v_BSKD.shape:
      raise ValueError(
        f"splash attention needs q [B, T, H, D] and k, v [B, S, K, D] of one "
        f"shape; got {q_BTHD.shape}, {k_BSKD.shape}, {v_BSKD.shape}"
      )
    B, T, H, D = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    if k_BSKD.shape[0] != B or k_BSKD.shape[3] != D:
      raise ValueError(
        f"k {k_BSKD.shape} must share batch B={B} and head dim D={D} with q {q_BTHD.shape}"
      )
    reason = problem(q_BTHD.shape, k_BSKD.shape, mask, bias_fn is not None)
    if reason is not None:
      raise ValueError(
        f"splash attention cannot run q {q_BTHD.shape}, k {k_BSKD.shape}: "
        f"{reason} (or use another kernel, e.g. 'xla')"
      )
    run_interpreted = platform.target_platform() != "tpu" if interpret is None else interpret
    q_seg, kv_seg, zero_empty = _segments(mask, B, T, S)
    # Splash has no logit scale: scale q in float32, then back to q.dtype.
    q_BTHD = (q_BTHD.astype(jnp.float32) * scale).astype(q_BTHD.dtype)
    plan = _Plan(
      mask.causal, _block(T, block_size), _block(S, block_size), bool(run_interpreted), zero_empty
    )
    run = functools.partial(_local_attention, plan)
    args = (q_BTHD, k_BSKD, v_BSKD) + (() if q_seg is None else (q_seg, kv_seg))

    # GSPMD cannot partition the Mosaic custom call: give each device its shard explicitly.
    sh = mesh.shards(B, H, K)
    if sh is None:  # no mesh, or already inside a shard_map over all of it
      return run(*args)
    specs = (sh.q, sh.kv, sh.kv) + (() if q_seg is None else (P(sh.batch, None),) * 2)
    return mesh.run_sharded(run, args, specs, sh.q, sh.free)

  return Kernel("splash", attend)


attend = kernel().attend


# ------------------------------------------------------------------------------ internals


class _Plan(NamedTuple):
  """What the per-device kernel needs besides the arrays."""

  causal: bool
  bq: int  # query block
  bkv: int  # key/value block
  interpret: bool
  zero_empty: bool  # rows may see no key (distinct q/kv segment ids): zero them


def _block(n: int, block: int) -> int:
  """The largest multiple of LANES that divides n (itself a multiple) and is <= block."""
  b = min(block, n) // LANES * LANES
  while n % b:
    b -= LANES
  return b


def _segments(mask, B, T, S):
  """(q_seg [B, T], kv_seg [B, S], whether rows may see no key), int32 or (None, None)."""
  if mask.segment_ids is None:
    return None, None, False
  q_seg = jnp.asarray(mask.segment_ids).astype(jnp.int32)
  # One array for both sides (self-attention, T == S): query i sees at least kv i.
  same = mask.self_segments
  kv_seg = q_seg if same else jnp.asarray(mask.kv_segment_ids).astype(jnp.int32)
  if q_seg.shape != (B, T) or kv_seg.shape != (B, S):
    raise ValueError(
      f"segment ids must be [B, T] = {(B, T)} and [B, S] = {(B, S)}, got "
      f"{q_seg.shape} and {kv_seg.shape} (segment_ids alone needs T == S)"
    )
  return q_seg, kv_seg, not same


def _kernel(H: int, T: int, S: int, plan: _Plan):
  """The splash MHA kernel for one head count and length pair; forward and both backward
  kernels use the same blocks. Built per call, in the caller's trace: its mask arrays are
  values of that trace (splash caches the host-side mask processing itself)."""
  one = sm.CausalMask((T, S)) if plan.causal else sm.FullMask((T, S))
  bq, bkv = plan.bq, plan.bkv
  sizes = sk.BlockSizes(
    block_q=bq,
    block_kv=bkv,
    block_kv_compute=bkv,
    block_q_dkv=bq,
    block_kv_dkv=bkv,
    block_kv_dkv_compute=bkv,
    block_q_dq=bq,
    block_kv_dq=bkv,
  )
  return sk.make_splash_mha_single_device(
    sm.MultiHeadMask((one,) * H), block_sizes=sizes, interpret=plan.interpret
  )


def _local_attention(plan: _Plan, q_BTHD, k_BSKD, v_BSKD, q_seg_BT=None, kv_seg_BS=None):
  """Splash on the arrays one device holds (all of them outside a mesh)."""
  T, H = q_BTHD.shape[1], q_BTHD.shape[2]
  S = k_BSKD.shape[1]
  kernel_fn = _kernel(H, T, S, plan)
  q_BHTD, k_BKSD, v_BKSD = (jnp.swapaxes(a, 1, 2) for a in (q_BTHD, k_BSKD, v_BSKD))
  if q_seg_BT is None:
    out_BHTD = jax.vmap(kernel_fn)(q_BHTD, k_BKSD, v_BKSD)
  else:
    one = lambda q, k, v, qs, ks: kernel_fn(q, k, v, sk.SegmentIds(q=qs, kv=ks))
    out_BHTD = jax.vmap(one)(q_BHTD, k_BKSD, v_BKSD, q_seg_BT, kv_seg_BS)
  out_BTHD = jnp.swapaxes(out_BHTD, 1, 2)
  if plan.zero_empty:
    has_key_BT = _has_visible_key(q_seg_BT, kv_seg_BS, plan.causal)
    out_BTHD = jnp.where(has_key_BT[:, :, None, None], out_BTHD, jnp.zeros((), out_BTHD.dtype))
  return out_BTHD


def _has_visible_key(q_seg_BT, kv_seg_BS, causal):
  """bool [B, T]: query i sees some kv j (same segment, and j <= i if causal), in
  O((T + S) log S) without a [T, S] mask: the first kv of each segment decides."""
  order_BS = jnp.argsort(kv_seg_BS, axis=-1, stable=True)  # equal ids keep kv order
  sorted_BS = jnp.take_along_axis(kv_seg_BS, order_BS, axis=-1)
  first_BT = jax.vmap(jnp.searchsorted)(sorted_BS, q_seg_BT)  # first kv of q's segment
  first_BT = jnp.minimum(first_BT, kv_seg_BS.shape[1] - 1)
  found_BT = jnp.take_along_axis(sorted_BS, first_BT, axis=-1) == q_seg_BT
  if causal:
    T = q_seg_BT.shape[1]
    found_BT &= jnp.take_along_axis(order_BS, first_BT, axis=-1) <= jnp.arange(T)[None, :]
  return found_BT
