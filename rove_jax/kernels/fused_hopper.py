"""The fused kernel for Hopper GPUs (sm90: H100, H200): flash attention in Pallas Mosaic GPU that
takes unrotated q, k, v with their positions and the rotary setup and rotates inside, as the TPU
kernel (rove_jax.kernels.fused, which has the math) does: q and k (RoPE) and v (RoVE) per tile
in shared memory and registers, the output back by R_i^-1 (RoVE), and in the backward pass
(rove_jax.kernels.fused_hopper_backward) dO by R_i and dq, dk, dv back. No rotated tensor is
written to HBM.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.

What runs, and why:
  * One program (a CUDA block of one warpgroup, 128 threads) a (query block, example, head),
    with bq = 64 query rows: wgmma's native M. Its kv head (h // G: GQA, MQA) is read in
    blocks of bk = 128 keys (64 when S is not a multiple of 128): the [64, 128] score tile and
    the [64, D] accumulator stay in registers, as in FlashAttention-3.
  * Given the [B, T, 3, H, D] buffer q, k and v were sliced from (KernelCall.qkv_BT3HD:
    rove_jax.attention.packed_attention, which the GPT's fused q, k, v projection calls), every
    kernel reads their tiles there in place (TMA copies of strided slices): no copies of q, k,
    v are made for it. Its gradient is dq, dk, dv stacked.
  * Operands move by TMA into swizzled shared memory, the layout wgmma reads (a 128-byte
    swizzle, or the narrower one column slices need). Key/value blocks are double-buffered:
    the copy of block j + 2 is issued as block j's products finish, so it overlaps block
    j + 1's work.
  * A tile is rotated between its TMA copy and the wgmma that reads it
    (rove_jax.kernels.fused_hopper_rotation): cos/sin tables from the positions in registers
    (trig.sincos: a reduction by whole turns in three FFMAs, then sin.approx and cos.approx; for the
    looped blocks of the kernels rotation.tables_copied names, copied in beside each block instead),
    float32, one rounding to bfloat16, a store to shared memory: in the buffer it arrived in where
    the rotation allows (rotation.in_place: slices, D = 64, pairs within a 64-column piece), which
    with no rotated copies or staging tiles lets two programs share an SM (two warps a
    sub-partition; `--ptxas` reports the programs an SM holds), else into a rotated copy. q once a
    program (with the softmax scale and YaRN's attention factor squared on its rotated dims), k and
    (RoVE) v once a block, 64 rows and a column piece at a time. In the half layout (n_rotated / 2 a
    multiple of 16: GPT-2's D = 64, Llama's D = 128) pairs are swapped by exchanging column slices,
    with cos and sin once a pair; elsewhere (interleaved, other partial rotary) by a wgmma with the
    [D, D] pair-swap matrix, cos and sin once a dim. The slices take no tensor core work and half
    the tables', and every kernel then compiles without register spills at D = 64 and 128
    (`python -m bench.fused_gpu --aot h200 --ptxas` reports registers and spills;
    kernel(slice_swap=False) keeps the matrix, to compare on a GPU). Hence HALF_PAIRS: the GPT's
    attention layer hands its interleaved rotary to this kernel as the half layout
    (rove_jax.nn.attention_layer, rotary.half_order).
  * kernel(bf16_turns=True) turns q, k, v and dO by slices in bfloat16 pairs, two values an
    instruction, rather than in float32 (rotation module docstring): fewer instructions a
    block for about one more bfloat16 rounding an element. Off by default until a GPU times it.
  * P = softmax numerator goes to the P.V wgmma from registers, as FA3 does. Its exponentials
    (and the backward pass's) are exp2(s log2(e) - m log2(e)) on the GPU's ex2 instruction
    under approximate math (fused_hopper_tiles.exp_minus): two instructions an element where
    an exact exp takes eight (python -m bench.fused_gpu --aot h200 --sass counts them).
  * kernel(compute_wgs=2) runs another forward (rove_jax.kernels.fused_hopper_ws): two compute
    warpgroups a program, 128 query rows, sharing each key/value block's copy and rotation (half the
    rotation work a query row), optionally with a producer warpgroup for the copies (and with
    bf16_turns for the turns: fused_hopper_ws.producer_turns). The default stays the one-warpgroup
    forward (rove_jax.kernels.fused_hopper_forward) until timings on an H200 choose.
  * kernel(backward_wgs=2) runs the backward kernels with two warpgroups a program
    (rove_jax.kernels.fused_hopper_backward_ws: 128 owned rows sharing each looped block's
    copy and rotation), with backward_producer a third warpgroup issuing their copies (and with
    bf16_turns turning the looped blocks: fused_hopper_backward_pipe); the one-warpgroup ones
    stay the default until timings choose.
  * Not yet done (each is speed, not numerics; timing on an H200 decides them): ping-pong
    between compute warpgroups, asynchronous wgmma overlapping the softmax.
Masks by index, like the other fused kernels: the Mask must be `ordered` (causal or not, with
segment ids or not, no kv_valid or window); rows that see no key return 0 (lse +inf).
bfloat16 only: wgmma's 16-bit inputs; float16 would need its own swap and staging dtype and
float32 would run as TF32, below the float32 precision the other kernels give. D is 64 or 128
(the [D, D] swap matrix and the tiles fit shared memory; (8, 64) tiles need D % 64 == 0); T and S
are multiples of 64.

Cost (what each program moves and computes, summed; N = B * H * bq * bk * block pairs run, the
causal mask leaving about half): the forward reads q and writes o once, and reads k, v once per
query block of each query head (about half of them under a causal mask): bytes =
2 * B * T * H * D * 2 + 2 * B * S * K * D * 2 * (T / bq) * G, plus the [D, D] swap matrix (not
with slices) and position rows per program; FLOPs = 4 * D * N (q.k, p.v) + 6 * D per rotated
row, and with the swap matrix 2 * D * D more per rotated row (rows rotated: B * T * H for q,
B * H * (pairs * bk) for k and again for v (RoVE), B * T * H twice for the output (RoVE));
transcendentals = N exp; and one sin and cos (trig.sincos(hardware=True): about ten float32
and integer operations and two of the quarter-rate unit for both, no conversions) per rotated
pair with slices, per rotated dim with the matrix. Where a kernel copies its looped blocks'
tables instead (rotation.tables_copied, tables_in_one_slot), no sin or cos is taken in its loop,
and each looped block also reads its rows' 2 r tables (4 r for RoVE's bfloat16 query tables):
float32, or bfloat16 with bf16_turns (at D = 64, as many bytes as the block's k).
No pl.CostEstimate is attached: XLA sees the Mosaic GPU call as opaque.

Under an active mesh the kernel runs in jax.shard_map (batch over ("data", "fsdp"), heads over
"tensor") through the same wrapper as the other fused kernels (fused._sharded, tested with the
Triton kernel on 4 CPU devices). This kernel itself has not run under a mesh: Mosaic GPU's
interpreter keeps one simulated shared memory for the process, and programs of several CPU
devices running at once trip its barrier checks. Off GPU it runs in that interpret mode,
products as jnp dots (fused_hopper_tiles), which is how the tests check it on CPU.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from rove_jax.kernels import (
  fused,
  fused_gpu_tiles,
  fused_hopper_backward,
  fused_hopper_backward_io,
  fused_hopper_backward_ws,
  fused_hopper_forward,
  fused_hopper_ws,
  platform,
)
from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels.call import Kernel, KernelCall
from rove_jax.kernels.fused_tiles import Plan

BLOCK_Q = 64  # wgmma's M: one warpgroup's rows
BLOCK_KV = 128
MIN_BLOCK = 64
HEAD_DIMS = (64, 128)
DTYPES = (jnp.dtype(jnp.bfloat16),)
KINDS = fused.KINDS
COMPUTE_WGS = (1, 2)  # forward warpgroups a program (kernel's compute_wgs)
# The half layout's pairs rotate by column slices, the interleaved layout's by a swap-matrix
# wgmma (kernels.Kernel.half_pairs; rove_jax.kernels.fused_hopper_rotation).
HALF_PAIRS = True


def problem(q_shape, k_shape, mask, rope, dtype=None) -> Optional[str]:
  """None when the Hopper fused kernel can run a call (q [B, T, H, D], k [B, S, K, D], a
  kernels.Mask, a rotary.Rope, q's dtype: None skips that check); otherwise the reason, for
  an error message."""
  reason = fused.rotary_problem(mask, rope)
  if reason is not None:
    return reason
  (_, T, H, D), (_, S, K, _) = q_shape, k_shape
  if min(T, S, H, K, D) < 1:
    return f"every size must be positive, got T={T}, S={S}, H={H}, K={K}, D={D}"
  if H % K:
    return f"query heads H={H} are not a multiple of kv heads K={K}"
  if dtype is not None and jnp.dtype(dtype) not in DTYPES:
    return (
      f"on Hopper it runs in bfloat16 (wgmma), got {jnp.dtype(dtype).name}; cast q, k, "
      f"v (e.g. the model's dtype='bfloat16')"
    )
  if D not in HEAD_DIMS:
    return f"on Hopper the head dim D={D} must be one of {HEAD_DIMS}"
  for name, n in (("query length T", T), ("kv length S", S)):
    if n % MIN_BLOCK:
      return f"{name}={n} is not a multiple of {MIN_BLOCK} (its smallest block on Hopper); pad it"
  return None


def kernel(
  block_kv: int = BLOCK_KV,
  interpret: Optional[bool] = None,
  compute_wgs: int = 1,
  producer: bool = False,
  slice_swap: Optional[bool] = None,
  backward_wgs: int = 1,
  bf16_turns: bool = False,
  backward_producer: bool = False,
) -> Kernel:
  """The Hopper fused kernel, one that rotates inside (kernels.call): the contract of
  rove_jax.kernels.fused.kernel.

  Args:
    block_kv: largest key/value block, 64 or 128 (with compute_wgs=2: 128); with D = 128 the
      one-warpgroup forward takes 64 (shared memory).
    interpret: Pallas Mosaic GPU interpret mode; None: on unless compiling for a GPU
      (platform.target_platform).
    compute_wgs: compute warpgroups a program in the forward pass: 1 (fused_hopper_forward)
      or 2 (rove_jax.kernels.fused_hopper_ws: 128 query rows a program sharing each rotated
      key/value block; T and S multiples of 128).
    producer: with compute_wgs=2, a third warpgroup issues the key/value copies.
    slice_swap: rotate by exchanging column slices rather than by the swap-matrix wgmma, in
      the forward and backward kernels (rove_jax.kernels.fused_hopper_rotation): True needs
      the half layout with n_rotated / 2 a multiple of 16; None (the default) slices where
      the call's rotary allows and takes the matrix elsewhere; False always the matrix.
    backward_wgs: compute warpgroups a program of the backward kernels: 1, or 2
      (rove_jax.kernels.fused_hopper_backward_ws: dq 128 query rows a program sharing each
      rotated key block, dk, dv 128 keys sharing each rotated query block; T and S multiples
      of 128).
    bf16_turns: turn the looped blocks (k, v; q, dO in dk, dv) by slices in bfloat16 pairs
      rather than in float32 (fused_hopper_rotation); needs the slice rotation.
    backward_producer: with backward_wgs=2, a third warpgroup issues the looped blocks' copies
      and, with bf16_turns and copied tables, turns them
      (rove_jax.kernels.fused_hopper_backward_pipe).
  """
  if block_kv not in (64, 128) or isinstance(block_kv, bool):
    raise ValueError(f"block_kv must be 64 or 128, got {block_kv!r}")
  if compute_wgs not in COMPUTE_WGS or isinstance(compute_wgs, bool):
    raise ValueError(f"compute_wgs must be one of {COMPUTE_WGS}, got {compute_wgs!r}")
  if compute_wgs > 1 and block_kv != fused_hopper_ws.BLOCK_KV:
    raise ValueError(f"compute_wgs={compute_wgs} shares blocks of {fused_hopper_ws.BLOCK_KV} keys")
  if producer and compute_wgs == 1:
    raise ValueError("producer=True needs compute_wgs=2")
  if backward_wgs not in (1, 2) or isinstance(backward_wgs, bool):
    raise ValueError(f"backward_wgs must be 1 or 2, got {backward_wgs!r}")
  if backward_producer and backward_wgs == 1:
    raise ValueError("backward_producer=True needs backward_wgs=2")

  def attend(call: KernelCall) -> jax.Array:
    q_BTHD, k_BSKD, v_BSKD = fused.checked_inputs(call)
    mask, rope, kind = call.mask, call.rope, call.kind
    q_pos_BT, kv_pos_BS = call.q_pos_BT, call.kv_pos_BS
    B, T, H, D = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    reason = problem(q_BTHD.shape, k_BSKD.shape, mask, rope, q_BTHD.dtype)
    if reason is None and not (k_BSKD.dtype == v_BSKD.dtype == q_BTHD.dtype):
      reason = f"q, k, v must share a dtype, got {q_BTHD.dtype}, {k_BSKD.dtype}, {v_BSKD.dtype}"
    if reason is None and compute_wgs > 1:
      reason = fused_hopper_ws.problem(T, S, compute_wgs, BLOCK_Q)
    if reason is None and backward_wgs > 1:
      reason = fused_hopper_backward_ws.problem(T, S)
    slice_reason = rotation.slice_problem(rope)
    slices = slice_reason is None if slice_swap is None else bool(slice_swap)
    if reason is None and slices:
      reason = slice_reason
    if reason is None and bf16_turns and not slices:
      why = "slice_swap=False" if slice_swap is not None else slice_reason
      reason = f"bf16_turns=True turns by slices: {why}"
    if reason is not None:
      raise ValueError(
        f"kernel='fused' cannot run q {q_BTHD.shape}, k {k_BSKD.shape} on Hopper: {reason}"
      )
    run_interpreted = platform.target_platform() != "gpu" if interpret is None else interpret
    q_seg, kv_seg = mask.segments()
    plan = Plan(
      causal=mask.causal,
      segmented=q_seg is not None,
      pair_offset=1 if rope.layout == "interleaved" else rope.n_rotated // 2,
      rotate_values=kind != "rope",
      rotate_output=kind == "rove",
      bq=BLOCK_Q,
      bk=_key_block(block_kv, S, D, compute_wgs),
      interpret=bool(run_interpreted),
      compute_wgs=compute_wgs,
      producer=bool(producer),
      slice_swap=slices,
      backward_wgs=backward_wgs,
      backward_producer=bool(backward_producer),
      packed=_packed(call),
      bf16_turns=bool(bf16_turns),
    )
    consts = fused.constants(rope, D, call.scale)
    swap = jnp.asarray(
      fused_gpu_tiles.swap_matrix(D, plan.pair_offset, rope.n_rotated), jnp.bfloat16
    )
    args = fused_gpu_tiles.row_operands(q_BTHD, k_BSKD, v_BSKD, q_pos_BT, kv_pos_BS, q_seg, kv_seg)
    if plan.packed:  # q, k, v in place in the buffer they were sliced from: no copies of them
      args = args[:-3] + [call.qkv_BT3HD]
    run = lambda *a: _local(plan, (consts, swap), *a)
    return fused._sharded(run, args, B, H, K, packed=plan.packed)

  return Kernel("fused", attend, rotates=True, half_pairs=HALF_PAIRS)


attend = kernel().attend


# ------------------------------------------------------------------------------ internals


def _key_block(block_kv: int, S: int, D: int, compute_wgs: int) -> int:
  """The key/value block: block_kv, or MIN_BLOCK where S is not a multiple of it or where, in
  the one-warpgroup forward, its buffers would not fit shared memory (D = 128 with 128 keys:
  two slots of k and v, their rotated copies, the swap matrix and the staging tiles ask for more
  than an H100/H200's 227 KiB)."""
  if S % block_kv or (compute_wgs == 1 and D * block_kv > 64 * BLOCK_KV):
    return MIN_BLOCK
  return block_kv


def _packed(call: KernelCall) -> bool:
  """Whether the kernel reads q, k, v from the call's [B, T, 3, H, D] buffer (KernelCall.qkv_BT3HD):
  given, and of q's shape and dtype."""
  qkv = call.qkv_BT3HD
  if qkv is None:
    return False
  B, T, H, D = call.q_BTHD.shape
  if qkv.shape != (B, T, 3, H, D) or qkv.dtype != call.q_BTHD.dtype:
    raise ValueError(
      f"KernelCall.qkv_BT3HD must be the [B, T, 3, H, D] buffer q {call.q_BTHD.shape} was "
      f"sliced from, in its dtype; got {qkv.shape} {qkv.dtype}"
    )
  return True


def _local(plan: Plan, fixed, q_pos, kv_pos, *rest):
  """The kernel on the arrays one device holds: position and segment rows [B, 1, n] to
  [B, n]."""
  q_seg, kv_seg = (rest[0][:, 0], rest[1][:, 0]) if plan.segmented else (None, None)
  small = fixed + (q_pos[:, 0], kv_pos[:, 0], q_seg, kv_seg)
  if plan.packed:
    return _fused_packed(plan, small, rest[-1])
  q_BTHD, k_BSKD, v_BSKD = rest[-3:]
  return _fused(plan, small, q_BTHD, k_BSKD, v_BSKD)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(plan, small, q_BTHD, k_BSKD, v_BSKD):
  """small: (constants, swap matrix, q positions [B, T], kv positions [B, S], q segments,
  kv segments); no gradient flows to them."""
  return _fused_fwd(plan, small, q_BTHD, k_BSKD, v_BSKD)[0]


def _fused_fwd(plan, small, q_BTHD, k_BSKD, v_BSKD):
  o_BTHD, lse_BHT = fused_hopper_forward.forward(plan, small, q_BTHD, k_BSKD, v_BSKD)
  return o_BTHD, (small, q_BTHD, k_BSKD, v_BSKD, o_BTHD, lse_BHT)


def _fused_bwd(plan, residuals, do_BTHD):
  small, q_BTHD, k_BSKD, v_BSKD, o_BTHD, lse_BHT = residuals
  # rowsum(dO . O) is the same before and after the output rotation (R is orthogonal).
  delta_BHT = jnp.einsum("bthd,bthd->bht", o_BTHD.astype(jnp.float32), do_BTHD.astype(jnp.float32))
  rows_BH3T = fused_hopper_backward_io.query_rows(small[2], lse_BHT, delta_BHT)
  args = (q_BTHD, k_BSKD, v_BSKD, do_BTHD.astype(q_BTHD.dtype), rows_BH3T)
  plan = fused_hopper_backward.plan_of(plan)
  kernels = fused_hopper_backward_ws if plan.backward_wgs == 2 else fused_hopper_backward
  grads = (kernels.dq(plan, small, *args),) + tuple(kernels.dkv(plan, small, *args))
  consts, swap = small[:2]
  return ((jnp.zeros_like(consts), jnp.zeros_like(swap), None, None, None, None),) + grads


_fused.defvjp(_fused_fwd, _fused_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_packed(plan, small, qkv_BT3HD):
  """_fused on q, k, v read in place from one [B, T, 3, H, D] buffer; its gradient is that
  buffer's, the three stacked."""
  return _fused_packed_fwd(plan, small, qkv_BT3HD)[0]


def _fused_packed_fwd(plan, small, qkv_BT3HD):
  return _fused_fwd(plan, small, qkv_BT3HD, qkv_BT3HD, qkv_BT3HD)


def _fused_packed_bwd(plan, residuals, do_BTHD):
  small_grad, *grads = _fused_bwd(plan, residuals, do_BTHD)
  # The transpose of the three slices (zero pads, summed) rather than a stack: XLA fuses it
  # with the consumers of the buffer's gradient (the projection bias's partial sums) into one
  # kernel, as it does when the slices were taken outside; a stack it leaves alone.
  qkv_BT3HD = residuals[1]
  _, split_vjp = jax.vjp(lambda x: (x[:, :, 0], x[:, :, 1], x[:, :, 2]), qkv_BT3HD)
  return small_grad, split_vjp(tuple(grads))[0]


_fused_packed.defvjp(_fused_packed_fwd, _fused_packed_bwd)
