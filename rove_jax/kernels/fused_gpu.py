"""The fused kernel for GPUs: flash attention in Pallas (Triton backend) that takes unrotated
q, k, v with their positions and the rotary setup, and rotates inside, as the TPU kernel
(rove_jax.kernels.fused, which has the math) does: q and k (RoPE) and v (RoVE) per tile in
registers, the output back by R_i^-1 (RoVE), and in the backward pass dO by R_i and dq, dk, dv
back (rove_jax.kernels.fused_gpu_backward). No rotated tensor is written to HBM.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.

How it differs from the TPU kernel, and why:
  * One program a (query block, example, head), as jax's Pallas GPU flash attention
    (jax.experimental.pallas.ops.gpu.attention) does: the key/value blocks are a loop inside
    it, the whole kv sequence of the head's kv head being its block (GQA/MQA: query head h
    reads kv head h // G through the index map). dk, dv: one program a (key block, example, kv
    head), looping over the G query heads and the query blocks.
  * The pair partner of each dim (pltpu.roll on TPU) is an exact product with a [D, D] 0/1
    matrix, and sin and cos of the tables are the kernel's own (one range reduction, no
    libdevice calls): rove_jax.kernels.fused_gpu_tiles, shared with the backward.
  * Registers are what a Triton program runs short of: tables and the swap matrix are made or
    read where they are used, not held across the key loop; the backward runs smaller blocks
    on more warps than the forward.
  * Blocks are powers of two (Triton's tiles are): the largest power of two that divides the
    length, at most `block_size`, at least MIN_BLOCK; the head dim is a power of two from 16
    (Triton's smallest matmul) to MAX_HEAD_DIM.
  * No cost estimate is attached (XLA sees the Triton call as opaque).
Masks, the softmax scale and attention factor, rows that see no key (0 out, lse +inf), the
mesh (jax.shard_map, batch over ("data", "fsdp") and heads over "tensor") and the gradients
(none to the rotary tables) are as in the TPU kernel. Off GPU it runs in Pallas interpret mode
(how the tests check it on CPU).
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rove_jax.kernels import fused, fused_gpu_backward, fused_tiles, platform, trig
from rove_jax.kernels.call import Kernel, KernelCall
from rove_jax.kernels.fused_gpu_tiles import (
  compiler_params,
  kernel_name,
  rotate,
  row_operands,
  swap_matrix,
  tables,
)
from rove_jax.kernels.fused_tiles import Plan

DEFAULT_BLOCK = 64
# The backward kernels hold more tiles a program (dq: q, dO and the dq accumulator; dk, dv: k,
# v and two accumulators), so their blocks are smaller, as in jax's Pallas GPU attention.
DEFAULT_BACKWARD_BLOCK = 32
MIN_BLOCK = 16  # Triton's smallest matmul side
MAX_HEAD_DIM = 128  # the [D, D] pair-swap matrix and the tiles stay in registers
KINDS = fused.KINDS
HALF_PAIRS = False  # both layouts rotate alike here (kernels.Kernel.half_pairs)


def problem(q_shape, k_shape, mask, rope, dtype=None) -> Optional[str]:
  """None when the GPU fused kernel can run a call (q [B, T, H, D], k [B, S, K, D], a
  kernels.Mask, a rotary.Rope; dtype, q's, is any float dtype here); otherwise the reason,
  for an error message."""
  del dtype  # every float dtype runs
  reason = fused.rotary_problem(mask, rope)
  if reason is not None:
    return reason
  (_, T, H, D), (_, S, K, _) = q_shape, k_shape
  if min(T, S, H, K, D) < 1:
    return f"every size must be positive, got T={T}, S={S}, H={H}, K={K}, D={D}"
  if H % K:
    return f"query heads H={H} are not a multiple of kv heads K={K}"
  if D & (D - 1) or not MIN_BLOCK <= D <= MAX_HEAD_DIM:
    return (
      f"on GPU the head dim D={D} must be a power of two from {MIN_BLOCK} to "
      f"{MAX_HEAD_DIM} (Triton tiles)"
    )
  for name, n in (("query length T", T), ("kv length S", S)):
    if n % MIN_BLOCK:
      return f"{name}={n} is not a multiple of {MIN_BLOCK} (its smallest block on GPU); pad it"
  return None


def kernel(
  block_size: int = DEFAULT_BLOCK,
  backward_block_size: int = DEFAULT_BACKWARD_BLOCK,
  interpret: Optional[bool] = None,
) -> Kernel:
  """The GPU fused kernel, one that rotates inside (kernels.call): the contract of
  rove_jax.kernels.fused.kernel.

  Args:
    block_size: largest q/kv block of the forward pass, a power of two >= MIN_BLOCK.
    backward_block_size: the same for the backward pass.
    interpret: Pallas interpret mode; None: on unless compiling for a GPU
      (platform.target_platform).
  """
  for name, b in (("block_size", block_size), ("backward_block_size", backward_block_size)):
    if isinstance(b, bool) or not isinstance(b, int) or b < MIN_BLOCK or b & (b - 1):
      raise ValueError(f"{name} must be a power of two >= {MIN_BLOCK}, got {b!r}")

  def attend(call: KernelCall) -> jax.Array:
    q_BTHD, k_BSKD, v_BSKD = fused.checked_inputs(call)
    mask, rope, kind = call.mask, call.rope, call.kind
    q_pos_BT, kv_pos_BS = call.q_pos_BT, call.kv_pos_BS
    B, T, H, D = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    reason = problem(q_BTHD.shape, k_BSKD.shape, mask, rope)
    if reason is not None:
      raise ValueError(
        f"kernel='fused' cannot run q {q_BTHD.shape}, k {k_BSKD.shape} on GPU: {reason}"
      )
    run_interpreted = platform.target_platform() != "gpu" if interpret is None else interpret
    q_seg, kv_seg = mask.segments()
    plan = Plan(
      causal=mask.causal,
      segmented=q_seg is not None,
      pair_offset=1 if rope.layout == "interleaved" else rope.n_rotated // 2,
      rotate_values=kind != "rope",
      rotate_output=kind == "rove",
      bq=_block(T, block_size),
      bk=_block(S, block_size),
      interpret=bool(run_interpreted),
    )
    plans = (
      plan,
      plan._replace(bq=_block(T, backward_block_size), bk=_block(S, backward_block_size)),
    )
    consts = fused.constants(rope, D, call.scale)
    swap = jnp.asarray(swap_matrix(D, plan.pair_offset, rope.n_rotated), jnp.bfloat16)
    args = row_operands(q_BTHD, k_BSKD, v_BSKD, q_pos_BT, kv_pos_BS, q_seg, kv_seg)
    run = lambda *a: _local(plans, (consts, swap), *a)
    return fused._sharded(run, args, B, H, K)

  return Kernel("fused", attend, rotates=True)


attend = kernel().attend


# ------------------------------------------------------------------------------ internals


def _block(n: int, block: int) -> int:
  """The largest power of two <= block that divides n (a multiple of MIN_BLOCK)."""
  b = block
  while n % b:
    b //= 2
  return b


def _local(plans, fixed, q_pos, kv_pos, *rest):
  """The kernel on the arrays one device holds."""
  q_seg, kv_seg = (rest[0], rest[1]) if plans[0].segmented else (None, None)
  q_BTHD, k_BSKD, v_BSKD = rest[-3:]
  return _fused(plans, fixed + (q_pos, kv_pos, q_seg, kv_seg), q_BTHD, k_BSKD, v_BSKD)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(plans, small, q_BTHD, k_BSKD, v_BSKD):
  """plans: the forward's and the backward's Plan (they differ in blocks). small: (constants,
  swap matrix, q positions, kv positions, q segments, kv segments); no gradient flows to
  them."""
  return _fused_fwd(plans, small, q_BTHD, k_BSKD, v_BSKD)[0]


def _fused_fwd(plans, small, q_BTHD, k_BSKD, v_BSKD):
  o_BTHD, lse_BHT = _forward(plans[0], small, q_BTHD, k_BSKD, v_BSKD)
  return o_BTHD, (small, q_BTHD, k_BSKD, v_BSKD, o_BTHD, lse_BHT)


def _fused_bwd(plans, residuals, do_BTHD):
  small, q_BTHD, k_BSKD, v_BSKD, o_BTHD, lse_BHT = residuals
  # rowsum(dO . O) is the same before and after the output rotation (R is orthogonal).
  delta_BHT = jnp.einsum("bthd,bthd->bht", o_BTHD.astype(jnp.float32), do_BTHD.astype(jnp.float32))
  grads = fused_gpu_backward.gradients(
    plans[1], small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT
  )
  consts, swap = small[:2]
  return ((jnp.zeros_like(consts), jnp.zeros_like(swap), None, None, None, None),) + grads


_fused.defvjp(_fused_fwd, _fused_bwd)


def _forward(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD):
  """(o [B, T, H, D] in q.dtype, logsumexp [B, H, T] float32; +inf for rows that see no
  key)."""
  consts, swap, q_pos, kv_pos, q_seg, kv_seg = small
  B, T, H, D = q_BTHD.shape
  S, K = k_BSKD.shape[1], k_BSKD.shape[2]
  G, bq = H // K, plan.bq
  whole = lambda a: pl.BlockSpec(a.shape, lambda i, b, h: (0,) * a.ndim)
  q_row = pl.BlockSpec((None, None, bq), lambda i, b, h: (b, 0, i))
  kv_row = pl.BlockSpec((None, None, S), lambda i, b, h: (b, 0, 0))
  q_spec = pl.BlockSpec((None, bq, None, D), lambda i, b, h: (b, i, h, 0))
  kv_spec = pl.BlockSpec((None, S, None, D), lambda i, b, h: (b, 0, jax.lax.div(h, G), 0))
  seg_specs = [q_row, kv_row] if plan.segmented else [None, None]
  in_specs = [whole(consts), whole(swap), q_row, kv_row, *seg_specs, q_spec, kv_spec, kv_spec]
  out_shape = [
    jax.ShapeDtypeStruct(q_BTHD.shape, q_BTHD.dtype),
    jax.ShapeDtypeStruct((B, H, T), jnp.float32),
  ]
  out_specs = [q_spec, pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i))]
  return pl.pallas_call(
    functools.partial(_forward_kernel, plan),
    grid=(T // bq, B, H),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    compiler_params=compiler_params(),
    interpret=plan.interpret,
    name=kernel_name(plan, "fwd"),
  )(consts, swap, q_pos, kv_pos, q_seg, kv_seg, q_BTHD, k_BSKD, v_BSKD)


def _forward_kernel(plan: Plan, *refs):
  """One query block of one head: q [bq, D] and the whole k, v [S, D] of its kv head.
  refs: the inputs and outputs in pallas_call's order, unpacked below."""
  (
    consts_ref,
    swap_ref,
    q_pos_ref,
    kv_pos_ref,
    q_seg_ref,
    kv_seg_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    lse_ref,
  ) = refs
  qi = pl.program_id(0)
  bq, bk, f32 = plan.bq, plan.bk, jnp.float32
  nk = k_ref.shape[0] // bk
  precision = fused_tiles.precision_for(q_ref.dtype)
  q_r = (
    rotate(q_ref[...], tables(q_pos_ref, consts_ref), swap_ref)
    * fused_tiles.query_scale(consts_ref)
  ).astype(q_ref.dtype)
  q_seg = q_seg_ref[...][:, None] if plan.segmented else None

  def step(ki, carry):
    acc, m_prev, l_prev = carry
    keys = pl.ds(ki * bk, bk)
    tabs = tables(kv_pos_ref, consts_ref, keys)
    k_r = rotate(k_ref[keys, :], tabs, swap_ref).astype(k_ref.dtype)
    v_r = v_ref[keys, :]
    if plan.rotate_values:
      v_r = rotate(v_r, tabs, swap_ref).astype(v_ref.dtype)
    s = fused_tiles.dot_nt(q_r, k_r, precision)  # [bq, bk]
    kv_seg = kv_seg_ref[keys][None, :] if plan.segmented else None
    mask = fused_tiles.visible(plan, qi, ki, q_seg, kv_seg, keys_in_rows=False)
    if mask is not None:
      s = jnp.where(mask, s, -jnp.inf)
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1))
    m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)  # a row with nothing visible yet
    p = trig.exp_minus(s, m_safe, lambda v: v[:, None])
    alpha = jnp.exp2((m_prev - m_safe) * trig.LOG2E)
    l_next = alpha * l_prev + jnp.sum(p, axis=1)
    acc = alpha[:, None] * acc + fused_tiles.dot_nn(p.astype(v_r.dtype), v_r, precision)
    return acc, m_next, l_next

  D = q_ref.shape[-1]
  init = (jnp.zeros((bq, D), f32), jnp.full((bq,), -jnp.inf, f32), jnp.zeros((bq,), f32))
  n_blocks = fused_tiles.last_key_block(plan, qi, nk) + 1
  acc, m, l = jax.lax.fori_loop(0, n_blocks, step, init)
  seen = l > 0.0
  o = acc / jnp.where(seen, l, 1.0)[:, None]
  if plan.rotate_output:
    # The query tables again, not held across the loop.
    o = rotate(o, tables(q_pos_ref, consts_ref), swap_ref, inverse=True)
  o_ref[...] = o.astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)
