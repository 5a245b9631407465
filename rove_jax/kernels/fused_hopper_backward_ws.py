"""The Hopper fused kernel's dk, dv kernel with two warpgroups a program:
`fused_hopper.kernel(backward_wgs=2)` runs it in place of rove_jax.kernels.fused_hopper_backward's
one-warpgroup dk, dv kernel (dq is the same either way). The math is that module's.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.

What runs, and why:
  * One program a (block of 2 x 64 keys, example, kv head): two compute warpgroups
    (plgpu.kernel's threads), each owning 64 of the keys (wgmma's native M) with its own k and
    v tiles, rotated once in place, and its own dk, dv accumulators.
  * The two share each query block they loop over (64 rows of q, dO and their position, lse,
    delta rows, for each of the G query heads): it is TMA-copied once a program
    (double-buffered: warpgroup 0 issues the copy of block t + 1 into the slot block t - 1
    left once both are past block t's barrier) and rotated once a program, in place: q (with
    the softmax scale) by warpgroup 0 and, RoVE, dO by warpgroup 1, which then meet at a
    barrier before either multiplies. The one-warpgroup kernel rotates each query block once
    for every 64 keys; here once for 128: half the rotation work (its sin/cos tables the
    largest part) and half the q and dO reads a key.
  * After the loop both meet at a second barrier, and each turns its accumulators back
    through its own slot of the query buffers (free then) as staging.
  * S must be a multiple of 128. Under a causal mask a program starts at the query block of
    its first key, so warpgroup 1 (keys 64 to 127 of the block) multiplies one fully masked
    block a head.
Cost a program, per query block: bytes 2 x 64 x D x 2 (q, dO) + 3 x 64 x 4 (rows), once for
128 keys; FLOPs 2 x (4 x 64 x 64 x D) (the four products of each warpgroup) and the rotation of
q (and dO) once. Shared memory: each warpgroup's k and v, two slots of q and dO, the swap
matrix (not with column slices), rows: about 70 KiB at D = 64, 160 KiB at D = 128.

Not yet done (speed; timing on an H200 decides): the same sharing in the dq kernel, a producer
warpgroup, asynchronous wgmma.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_backward as backward
from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels.fused_tiles import CONST_ROWS, Plan

W = 2  # compute warpgroups a program
THREAD = "wg"  # plgpu.kernel's thread axis: one warpgroup a thread
BLOCK = backward.BLOCK  # rows of each warpgroup's key block and of a query block


def problem(S: int) -> str | None:
  """None when the two-warpgroup dk, dv kernel takes S keys; else the reason."""
  if S % (W * BLOCK):
    return f"kv length S={S} is not a multiple of {W * BLOCK} (backward_wgs={W} x {BLOCK} keys)"
  return None


def dkv(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT):
  """(dk [B, S, K, D], dv [B, S, K, D]) in the inputs' dtype, as fused_hopper_backward's."""
  B, T, H, D = q_BTHD.shape
  S, K = k_BSKD.shape[1], k_BSKD.shape[2]
  args = backward.kernel_args(plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT)
  n_loop = 5 + (1 if plan.segmented else 0)
  b, dt = BLOCK, q_BTHD.dtype
  smem = lambda shape: plgpu.SMEM(shape, dt, transforms=rotation.transforms(plan))
  scratch = [
    plgpu.SMEM((CONST_ROWS, D), jnp.float32),
    rotation.swap_scratch(plan, D, smem),
    smem((W, 2, b, D)),  # each warpgroup's k, v (rotated in place, then dk, dv)
    plgpu.SMEM((W, b), jnp.float32),
    plgpu.SMEM((W, b), jnp.int32),  # each warpgroup's key positions, segment ids
    smem((2, 2, b, D)),  # q, dO a slot (rotated in place; after the loop: staging)
    plgpu.SMEM((2, 3, b), jnp.float32),
    plgpu.SMEM((2, b), jnp.int32),  # positions, lse, delta; segment ids a slot
    plgpu.Barrier(num_barriers=2),  # constants, swap
    plgpu.Barrier(num_barriers=4 * W),  # a warpgroup's k, v, positions, segments
    plgpu.Barrier(num_barriers=2 * n_loop),  # a slot's copies
    plgpu.Barrier(num_arrivals=W),  # a query block rotated
    plgpu.Barrier(num_arrivals=W),  # both done with the loop
  ]
  out_type = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (k_BSKD, v_BSKD)]
  body = functools.partial(_body, plan, T // b, H // K)
  grid = (K, S // (W * b), B)
  return tiles.run_kernel(
    plan,
    tiles.named(plan, f"dkv_{W}wg", body),
    out_type,
    scratch,
    grid,
    ("kv_heads", "kv", "batch"),
    *args,
    num_threads=W,
    thread_name=THREAD,
  )


def _body(plan: Plan, nq: int, G: int, *refs):
  """A warpgroup's 64 keys of the program's 128, against every query block of its G heads."""
  r, (dk_ref, dv_ref), scr = backward._unpack(plan, refs, 2)
  (consts_s, swap_s, own_s, own_pos, own_seg, loop_s, loop_rows, loop_seg) = scr[:8]
  fixed_bar, own_bar, loop_bar, rotated_bar, done_bar = scr[8:]
  ops = tiles.Ops(plan.interpret)
  rot = rotation.of(plan, ops, consts_s, swap_s)
  bq, dt = BLOCK, own_s.dtype
  wg = lax.axis_index(THREAD)
  b, kh, kb = lax.axis_index("batch"), lax.axis_index("kv_heads"), lax.axis_index("kv")
  k_start = kb * (W * BLOCK) + wg * BLOCK
  keys = pl.ds(k_start, BLOCK)
  n_loop = 5 + (1 if plan.segmented else 0)
  n_fixed = 1 if plan.slice_swap else 2

  @pl.when(wg == 0)
  def _():
    plgpu.copy_gmem_to_smem(r["consts"], consts_s, fixed_bar.at[0])
    if not plan.slice_swap:
      plgpu.copy_gmem_to_smem(r["swap"], swap_s, fixed_bar.at[1])

  k_own, v_own = own_s.at[wg, 0], own_s.at[wg, 1]
  copies = [(r["k"].at[b, keys, kh], k_own), (r["v"].at[b, keys, kh], v_own)]
  copies.append((r["kv_pos"].at[b, keys], own_pos.at[wg]))
  if plan.segmented:
    copies.append((r["kv_seg"].at[b, keys], own_seg.at[wg]))
  for n, (src, dst) in enumerate(copies):
    plgpu.copy_gmem_to_smem(src, dst, own_bar.at[wg * 4 + n])

  # The query blocks from the one holding the program's first key (causal), for each head.
  first = lax.div(kb * (W * BLOCK), jnp.int32(bq)) if plan.causal else jnp.int32(0)
  per_head = nq - first
  n_steps = G * per_head

  def fetch(t, slot):
    where = (b, kh * G + lax.div(t, per_head), (first + lax.rem(t, per_head)) * bq)
    backward.fetch_queries(plan, r, (loop_s, loop_rows, loop_seg), loop_bar, where, slot)

  @pl.when(wg == 0)
  def _():
    fetch(0, 0)  # n_steps >= G >= 1: every key block has a query block at or after it
    pl.when(n_steps > 1)(lambda: fetch(1, 1))

  for n in range(n_fixed):
    plgpu.barrier_wait(fixed_bar.at[n])
  for n in range(len(copies)):
    plgpu.barrier_wait(own_bar.at[wg * 4 + n])
  pairs = [(k_own, k_own)] + ([(v_own, v_own)] if plan.rotate_values else [])
  rot.to(pairs, own_pos.at[wg])  # in place
  plgpu.commit_smem()
  kv_seg = ops.load(own_seg.at[wg], 1) if plan.segmented else None

  def step(t, carry):
    slot = lax.rem(t, 2)
    for n in range(n_loop):
      plgpu.barrier_wait(loop_bar.at[slot * n_loop + n])
    q_s, do_s, q_pos = loop_s.at[slot, 0], loop_s.at[slot, 1], loop_rows.at[slot, 0]
    pl.when(wg == 0)(lambda: rot.to([(q_s, q_s)], q_pos, scale_first=True))
    if plan.rotate_output:
      pl.when(wg == 1)(lambda: rot.to([(do_s, do_s)], q_pos))
    plgpu.commit_smem()
    plgpu.barrier_arrive(rotated_bar)
    plgpu.barrier_wait(rotated_bar)
    # Block t + 1 into the slot block t - 1 left: both are past block t's barrier.
    pl.when((wg == 0) & (t >= 1) & (t + 1 < n_steps))(lambda: fetch(t + 1, lax.rem(t + 1, 2)))
    starts = ((first + lax.rem(t, per_head)) * bq, k_start)
    operands = (k_own, v_own, q_s, do_s)
    rows = (loop_rows.at[slot], loop_seg.at[slot])
    return backward.key_products(ops, plan, carry, operands, starts, kv_seg, rows)

  D = own_s.shape[-1]
  zeros = ops.wgmma_layout(jnp.zeros((BLOCK, D), jnp.float32))
  dk_acc, dv_acc = lax.fori_loop(0, n_steps, step, (zeros, zeros))
  plgpu.barrier_arrive(done_bar)  # the query buffers are free: each takes its slot as staging
  plgpu.barrier_wait(done_bar)
  stage, kv_pos = loop_s.at[wg], own_pos.at[wg]
  rot.f32(dk_acc, kv_pos, stage, k_own, inverse=True)
  if plan.rotate_values:
    rot.f32(dv_acc, kv_pos, stage, v_own, inverse=True)
  else:
    v_own[...] = dv_acc.astype(dt)
  tiles.store((k_own, dk_ref.at[b, keys, kh]), (v_own, dv_ref.at[b, keys, kh]))
