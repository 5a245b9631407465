"""The Hopper fused kernel's backward pass: two Pallas Mosaic GPU kernels, dq (one program a
query block of a head, looping over key blocks) and dk, dv (one program a key block of a kv
head, looping over its G query heads and their query blocks), each rotating the tiles it reads
on their way into shared memory and its gradients back before they are stored. The math is
rove_jax.kernels.fused_backward's:

  p = exp(q_r . k_r - lse),  ds = p * (dO_r . v_r - delta)
  dq_r += ds . k_r                -> dq = R_i^-1 (scale * C^2 * dq_r)
  dk_r += ds^T . q_r,  dv_r += p^T . dO_r  -> dk = R_j^-1 dk_r, dv = R_j^-1 dv_r (RoVE)

with q_r = scale * C^2 * R_i q, k_r = R_j k, v_r = R_j v (RoVE; v otherwise), dO_r = R_i dO
(RoVE; dO otherwise). The dk, dv kernel works on transposed scores [bk, bq], so every product
is a wgmma whose left operand is a tile (in shared memory or registers) and whose right one is
in shared memory, transposed or not. Blocks are 64 x 64 (a warpgroup holds two [64, D] float32
accumulators and four [64, 64] score-sized tiles); copies are double-buffered as in the
forward pass (rove_jax.kernels.fused_hopper). fused_hopper picks this module's dk, dv kernel
or rove_jax.kernels.fused_hopper_backward_ws's (two warpgroups, kernel(backward_wgs=2)), which
builds on the products (`key_products`, `query_products`) and loop orders here and on the
operands and copies of rove_jax.kernels.fused_hopper_backward_io (both kernels' inputs, the
looped blocks' TMA copies and their cos/sin tables).

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_backward_io as io
from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels.fused_tiles import CONST_ROWS, Plan

BLOCK = 64


def plan_of(plan: Plan) -> Plan:
  """The backward kernels' plan: the forward's with BLOCK x BLOCK blocks."""
  return plan._replace(bq=BLOCK, bk=BLOCK)


def _scratch(plan: Plan, D, dt, n_loop_bars, tabled, queries_looped, one_slot):
  """Shared memory of either kernel: constants, swap; the program's own tiles (two [b, D]
  tiles, their rows and segment ids); a double-buffered loop of two tiles a slot with their
  rows (positions, lse, delta) and segment ids; rotated copies; staging; barriers; the looped
  blocks' tables where tabled (io.loop_tables: two slots, one with one_slot) and the one
  slot's barrier. The segment buffers are allocated unsegmented too (a few hundred bytes),
  which keeps one unpacking. Where the rotation allows (rotation.in_place) every tile is
  rotated in its own buffer and the outputs are staged in the own tiles: the rotated copies and
  staging are placeholders, 32 KiB less at D = 64 and 64 at D = 128 (two programs an SM fit
  there)."""
  b = BLOCK
  smem = lambda shape: plgpu.SMEM(shape, dt, transforms=rotation.transforms(plan))
  copies = [tiles.placeholder()] * 2 if rotation.in_place(plan, D) else [smem((2, b, D))] * 2
  return [
    plgpu.SMEM((CONST_ROWS, D), jnp.float32),
    rotation.swap_scratch(plan, D, smem),
    smem((2, b, D)),
    plgpu.SMEM((3, b), jnp.float32),
    plgpu.SMEM((b,), jnp.int32),
    smem((2, 2, b, D)),
    plgpu.SMEM((2, 3, b), jnp.float32),
    plgpu.SMEM((2, b), jnp.int32),
    *copies,  # rotated tiles, float32 staging
    plgpu.Barrier(num_barriers=8),
    plgpu.Barrier(num_barriers=2 * n_loop_bars),
    io.loop_tables(plan, b, tabled, queries_looped, 1 if one_slot else 2),
    plgpu.Barrier(num_barriers=1),  # the tables' one slot
  ]


def dq(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T):
  B, T, H, D, S, K = tiles.dims(plan, q_BTHD, k_BSKD)
  arrays = (q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T)
  one_slot = rotation.tables_in_one_slot(plan, D, forward=False)
  args, tabled, n_loop = io.operands(
    plan, small, arrays, queries_looped=False, wgs=1, one_slot=one_slot
  )
  scratch = _scratch(plan, D, q_BTHD.dtype, n_loop, tabled, False, one_slot)
  body = functools.partial(_dq_body, plan, S // BLOCK, H // K, tabled, one_slot)
  return tiles.run_kernel(
    plan,
    tiles.named(plan, "dq", body),
    jax.ShapeDtypeStruct((B, T, H, D), q_BTHD.dtype),
    scratch,
    (H, T // BLOCK, B),
    ("heads", "q", "batch"),
    *args,
  )


def _dq_body(plan: Plan, nk: int, G: int, tabled: bool, one_slot: bool, *refs):
  """One query block of one head: q, dO [bq, D] and its lse, delta rows; k, v blocks looped
  (with tabled, their tables copied beside them, or with one_slot into a slot of their own:
  rotation.tables_in_one_slot)."""
  r, (dq_ref,), scr = io.unpack(plan, refs, 1, tabled)
  (
    consts_s,
    swap_s,
    own_s,
    own_rows,
    own_seg,
    loop_s,
    loop_rows,
    loop_seg,
    rot_s,
    stage_s,
    fixed_bar,
    loop_bar,
    loop_tabs,
    tab_bar,
  ) = scr
  ops = tiles.Ops(plan.interpret)
  rot = rotation.of(plan, ops, consts_s, swap_s)
  bq, bk = plan.bq, plan.bk
  b, h, qb = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q")
  kh = lax.div(h, jnp.int32(G))
  q_start = qb * bq
  rows = pl.ds(q_start, bq)
  copies = rotation.constant_copies(plan, (r["consts"], consts_s), (r["swap"], swap_s))
  copies += [
    (r["q"].at[b, rows, h], own_s.at[0]),
    (r["do"].at[b, rows, h], own_s.at[1]),
    (r["q_rows"].at[b, h, :, rows], own_rows),  # position, lse, delta
  ]
  if plan.segmented:
    copies.append((r["q_seg"].at[b, rows], own_seg))
  for n, (src, dst) in enumerate(copies):
    plgpu.copy_gmem_to_smem(src, dst, fixed_bar.at[n])
  D = own_s.shape[-1]
  n_loop = io.loop_copies(plan, False, tabled, one_slot)
  bufs = (loop_s, loop_rows, loop_seg, loop_tabs)

  def fetch(j, slot):
    io.fetch_keys(plan, r, bufs, loop_bar, (b, kh, j), slot, one_slot)

  fetch_tables = lambda j: tiles.fetch_tables(r.get("tables"), loop_tabs, tab_bar.at[0], b, j, bk)
  n_blocks = tiles.last_key_block(plan, q_start, nk) + 1
  tiles.first_key_fetches(fetch, nk, n_blocks, fetch_tables if one_slot else None)
  for n in range(len(copies)):
    plgpu.barrier_wait(fixed_bar.at[n])
  in_place = rotation.in_place(plan, D)
  # q_r and (RoVE) dO_r in place or into the staging buffers (own_s then keeps q and dO for
  # nothing more).
  q_r_s, do_r_s = _turn(plan, rot, own_s, stage_s, own_rows.at[0], in_place, True)
  plgpu.commit_smem()
  stats = (ops.load(own_rows.at[1], 1), ops.load(own_rows.at[2], 1))  # lse, delta
  q_seg = ops.load(own_seg, 1) if plan.segmented else None

  def step(j, acc, masked=True):
    slot = lax.rem(j, 2)
    tiles.wait_block(loop_bar, slot, n_loop, tab_bar.at[0] if one_slot else None)
    tabs = loop_tabs.at[0 if one_slot else slot]
    turned = io.looped_rows(r, loop_rows.at[slot, 0], tabs)
    k_r, v_r = _turn(plan, rot, loop_s.at[slot], rot_s, turned, in_place, False)
    kv_seg = ops.load(loop_seg.at[slot], 0) if plan.segmented else None
    plgpu.commit_smem()
    if one_slot:  # every warp has turned the block: its tables' slot is free
      pl.when(j + 1 < n_blocks)(lambda: fetch_tables(j + 1))
    operands = (q_r_s, do_r_s, k_r, v_r)
    where = (q_start, j * bk)
    acc = query_products(ops, plan, acc, operands, where, (q_seg, kv_seg), stats, masked)
    pl.when(j + 2 < n_blocks)(lambda: fetch(j + 2, slot))
    return acc

  zeros = ops.wgmma_layout(jnp.zeros((bq, D), jnp.float32))
  acc = tiles.key_block_loop(plan, q_start, n_blocks, step, zeros)
  # The scale and the tables from shared memory again, not held across the loop.
  dq = acc * rotation.query_scale(ops, consts_s, acc.shape)
  rot.f32(dq, own_rows.at[0], own_s.at[0] if in_place else stage_s, own_s.at[0], inverse=True)
  tiles.store((own_s.at[0], dq_ref.at[b, rows, h]))


def dkv(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T):
  B, T, H, D, S, K = tiles.dims(plan, q_BTHD, k_BSKD)
  arrays = (q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T)
  args, tabled, n_loop = io.operands(plan, small, arrays, queries_looped=True, wgs=1)
  scratch = _scratch(plan, D, q_BTHD.dtype, n_loop, tabled, True, False)
  out_type = [jax.ShapeDtypeStruct((B, S, K, D), k_BSKD.dtype)] * 2
  body = functools.partial(_dkv_body, plan, T // BLOCK, H // K, tabled)
  return tiles.run_kernel(
    plan,
    tiles.named(plan, "dkv", body),
    out_type,
    scratch,
    (K, S // BLOCK, B),
    ("kv_heads", "kv", "batch"),
    *args,
  )


def _dkv_body(plan: Plan, nq: int, G: int, tabled: bool, *refs):
  """One key block of one kv head: k, v [bk, D]; the query blocks of its G query heads
  looped (q, dO and their position, lse, delta rows)."""
  r, (dk_ref, dv_ref), scr = io.unpack(plan, refs, 2, tabled)
  (
    consts_s,
    swap_s,
    own_s,
    own_rows,
    own_seg,
    loop_s,
    loop_rows,
    loop_seg,
    rot_s,
    stage_s,
    fixed_bar,
    loop_bar,
    loop_tabs,
    tab_bar,
  ) = scr
  ops = tiles.Ops(plan.interpret)
  rot = rotation.of(plan, ops, consts_s, swap_s)
  bq, bk, dt = plan.bq, plan.bk, own_s.dtype
  b, kh, kb = lax.axis_index("batch"), lax.axis_index("kv_heads"), lax.axis_index("kv")
  k_start = kb * bk
  keys = pl.ds(k_start, bk)
  copies = rotation.constant_copies(plan, (r["consts"], consts_s), (r["swap"], swap_s))
  copies += [
    (r["k"].at[b, keys, kh], own_s.at[0]),
    (r["v"].at[b, keys, kh], own_s.at[1]),
    (r["kv_pos"].at[b, keys], own_rows.at[0]),
  ]
  if plan.segmented:
    copies.append((r["kv_seg"].at[b, keys], own_seg))
  for n, (src, dst) in enumerate(copies):
    plgpu.copy_gmem_to_smem(src, dst, fixed_bar.at[n])
  D = own_s.shape[-1]
  n_loop = io.loop_copies(plan, True, tabled)
  first = lax.div(k_start, jnp.int32(bq)) if plan.causal else jnp.int32(0)
  per_head = nq - first
  n_steps = G * per_head
  assert plan.bq == plan.bk, "one diagonal query block a head needs square blocks"
  block_of, n_masked = query_block_order(plan, G, first, per_head)

  def fetch(t, slot):
    g, qb = block_of(t)
    where = (b, kh * G + g, qb * bq)
    io.fetch_queries(plan, r, (loop_s, loop_rows, loop_seg, loop_tabs), loop_bar, where, slot)

  fetch(0, 0)  # n_steps >= G >= 1: every key block has a query block at or after it
  pl.when(n_steps > 1)(lambda: fetch(1, 1))
  for n in range(len(copies)):
    plgpu.barrier_wait(fixed_bar.at[n])
  in_place = rotation.in_place(plan, D)
  k_r_s, v_r_s = _turn(plan, rot, own_s, stage_s, own_rows.at[0], in_place, False)
  plgpu.commit_smem()
  kv_seg = ops.load(own_seg, 1) if plan.segmented else None

  def step(t, carry, masked=True):
    slot = lax.rem(t, 2)
    tiles.wait_block(loop_bar, slot, n_loop)
    turned = io.looped_rows(r, loop_rows.at[slot, 0], loop_tabs.at[slot])
    q_r, do_r = _turn(plan, rot, loop_s.at[slot], rot_s, turned, in_place, True)
    plgpu.commit_smem()
    starts = (block_of(t)[1] * bq, k_start)
    carry = key_products(
      ops,
      plan,
      carry,
      (k_r_s, v_r_s, q_r, do_r),
      starts,
      kv_seg,
      (loop_rows.at[slot], loop_seg.at[slot]),
      masked,
    )
    pl.when(t + 2 < n_steps)(lambda: fetch(t + 2, slot))
    return carry

  zeros = ops.wgmma_layout(jnp.zeros((bk, D), jnp.float32))
  dk_acc, dv_acc = diagonal_first_loop(n_masked, n_steps, step, (zeros, zeros))
  # The tables from the positions again, not held across the loop.
  kv_pos = own_rows.at[0]
  rot.f32(dk_acc, kv_pos, own_s.at[0] if in_place else rot_s, own_s.at[0], inverse=True)
  if plan.rotate_values:
    rot.f32(dv_acc, kv_pos, own_s.at[1] if in_place else rot_s, own_s.at[1], inverse=True)
  else:
    own_s.at[1][...] = dv_acc.astype(dt)
  tiles.store((own_s.at[0], dk_ref.at[b, keys, kh]), (own_s.at[1], dv_ref.at[b, keys, kh]))


def head_major(first, per_head):
  """t -> (head within the kv head's group, query block) of a dk, dv loop's step t over its
  heads' query blocks first .. first + per_head - 1, head by head."""
  return lambda t: (lax.div(t, per_head), first + lax.rem(t, per_head))


def query_block_order(plan: Plan, G: int, first, per_head, n_diag: int = 1, split: bool = True):
  """A dk, dv loop's order (`head_major`'s mapping), and how many of its first steps need the
  mask. Where the mask is on the diagonal only (tiles.mask_on_diagonal_only) and split, steps
  0 .. n_diag * G - 1 are each head's blocks first .. first + n_diag - 1, those the program's
  keys reach into (n_diag = its keys / bq: one for the one-warpgroup kernel, bq == bk; two for
  the two-warpgroup one), head by head; the rest follow head by head, every query of them past
  every key of the program. Returns (block_of, masked steps)."""
  if not (split and tiles.mask_on_diagonal_only(plan)):
    return head_major(first, per_head), G * per_head
  rest = jnp.maximum(per_head - n_diag, 1)

  def block_of(t):
    u = jnp.maximum(t - n_diag * G, 0)
    on_diagonal = t < n_diag * G
    g = jnp.where(on_diagonal, lax.div(t, n_diag), lax.div(u, rest))
    qb = jnp.where(on_diagonal, first + lax.rem(t, n_diag), first + n_diag + lax.rem(u, rest))
    return g, qb

  return block_of, jnp.minimum(n_diag * G, G * per_head)


def diagonal_first_loop(n_masked, n_steps, step, carry):
  """lax.fori_loop of step(t, carry, masked) over steps 0 .. n_steps - 1 in `query_block_order`:
  the first n_masked with the mask, the rest in a loop whose code has none."""
  carry = lax.fori_loop(0, n_masked, step, carry)
  return lax.fori_loop(n_masked, n_steps, lambda t, c: step(t, c, masked=False), carry)


def _turn(plan: Plan, rot, tiles_s, copies_s, rows, in_place: bool, queries: bool):
  """Rotates a pair of [b, D] tiles in shared memory (tiles_s.at[0], .at[1]): k and (RoVE) v,
  or with queries q (times the query scale) and (RoVE) dO; in place, or into copies_s, at the
  positions or by the tables in rows (Rotation.to; io.looped_rows). Returns the two
  tiles the products read (the second unrotated where it is not turned)."""
  second = plan.rotate_output if queries else plan.rotate_values
  src = [tiles_s.at[0]] + ([tiles_s.at[1]] if second else [])
  dst = src if in_place else [copies_s.at[0], copies_s.at[1]]
  rot.to(list(zip(src, dst)), rows, scale_first=queries)
  return dst[0], dst[1] if second else tiles_s.at[1]


def query_products(ops, plan: Plan, acc, operands, starts, segs, stats, masked: bool = True):
  """One key block's contribution to a query block's dq_r accumulator [bq, D] (acc). operands:
  (q_r, dO_r, k_r, v_r) tiles in shared memory; starts: (first query, first key) index; segs:
  (the queries', the keys' segment ids) or Nones; stats: the queries' (lse, delta) [bq];
  masked=False: every key of the block is visible to every query (tiles.key_block_loop)."""
  q_r, do_r, k_r, v_r = operands
  lse, delta = stats
  s = ops.mma(q_r, k_r, transpose_b=True)  # [bq, bk]
  mask = tiles.visible(ops, plan, *starts, *segs, s.shape, keys_in_rows=False) if masked else None
  if mask is not None:
    s = jnp.where(mask, s, -jnp.inf)
  p = tiles.exp_minus(s, lse, 1)
  ds = p * minus_delta_plus(ops, do_r, v_r, delta, 1)
  return ops.mma(ds.astype(k_r.dtype), k_r, acc=acc)


def minus_delta_plus(ops, a_ref, b_ref, delta, along: int):
  """a b^T - delta [n, m] (delta one value per row, along=1, or per column, along=0): the
  product accumulated onto -delta, which spares the subtraction of each element: in these loops
  ptxas moves zeros into this product's fresh accumulator rather than starting it empty, so
  moving -delta there instead costs nothing more."""
  shape = (a_ref.shape[0], b_ref.shape[0])
  start = ops.wgmma_layout(-tiles.across(delta, shape, along))
  return ops.mma(a_ref, b_ref, transpose_b=True, acc=start)


def key_products(ops, plan: Plan, carry, operands, starts, kv_seg, rows, masked: bool = True):
  """One query block's contribution to a key block's (dk_r, dv_r) accumulators [bk, D] (carry),
  on transposed scores [bk, bq]. operands: (k_r, v_r, q_r, dO_r) tiles in shared memory;
  starts: (first query, first key) index; kv_seg: the keys' segment ids (or None); rows: the
  query block's [3, bq] rows (positions, lse, delta) and segment ids in shared memory;
  masked=False: every key of the block is visible to every query."""
  dk_acc, dv_acc = carry
  k_r, v_r, q_r, do_r = operands
  rows_s, seg_s = rows
  dt = k_r.dtype
  lse, delta = ops.load(rows_s.at[1], 0), ops.load(rows_s.at[2], 0)
  q_seg = ops.load(seg_s, 0) if plan.segmented else None
  s_t = ops.mma(k_r, q_r, transpose_b=True)  # [bk, bq]
  mask = None
  if masked:
    mask = tiles.visible(ops, plan, *starts, q_seg, kv_seg, s_t.shape, keys_in_rows=True)
  if mask is not None:
    s_t = jnp.where(mask, s_t, -jnp.inf)
  p_t = tiles.exp_minus(s_t, lse, 0)
  dv_acc = ops.mma(p_t.astype(dt), do_r, acc=dv_acc)
  if plan.backward_wgs > 1:
    ds_t = p_t * minus_delta_plus(ops, v_r, do_r, delta, 0)
  else:  # 255 registers at D = 128: the accumulator's start would cost more than it saves
    ds_t = p_t * (ops.mma(v_r, do_r, transpose_b=True) - tiles.across(delta, s_t.shape, 0))
  dk_acc = ops.mma(ds_t.astype(dt), q_r, acc=dk_acc)
  return dk_acc, dv_acc
