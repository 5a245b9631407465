"""The Hopper fused kernel's backward kernels with two warpgroups a program:
`fused_hopper.kernel(backward_wgs=2)` runs them in place of rove_jax.kernels.fused_hopper_backward's
one-warpgroup dq and dk, dv kernels. The math, the copies (`fetch_queries`, `fetch_keys`) and
the products (`key_products`, `query_products`) are that module's.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.

What runs, and why (dk, dv; dq is the same with queries and keys exchanged):
  * One program a (block of 2 x 64 keys, example, kv head): two compute warpgroups
    (plgpu.kernel's threads), each owning 64 of the keys (wgmma's native M) with its own k and
    v tiles, rotated once in place, and its own dk, dv accumulators. dq: a (block of 2 x 64
    queries, example, head), each warpgroup owning 64 query rows (q, dO, lse, delta) and its
    dq accumulator.
  * The two share each block they loop over (dk, dv: 64 rows of q, dO and their position, lse,
    delta rows, for each of the G query heads; dq: 64 keys of k, v and their positions): it is
    TMA-copied once a program (double-buffered: warpgroup 0 issues the copy of block t + 1
    into the slot block t - 1 left once both are past block t's barrier) and rotated once a
    program, in place: q with the softmax scale (dq: k) by warpgroup 0 and, RoVE, dO (dq: v)
    by warpgroup 1, which then meet at a barrier before either multiplies. The one-warpgroup
    kernels rotate each looped block once for every 64 owned rows; here once for 128: half the
    rotation work (its sin/cos tables the largest part) and half the looped reads a row. With
    plan.backward_producer a third warpgroup issues those copies and, with bf16 turns by copied
    tables, turns each block (rove_jax.kernels.fused_hopper_backward_pipe).
  * After the loop both meet at a second barrier, and each turns its accumulators back
    through its own slot of the loop buffers (free then) as staging.
  * T and S must be multiples of 128. Under a causal mask warpgroup 1 of a dk, dv program
    (keys 64 to 127 of the block) multiplies one fully masked query block a head, and
    warpgroup 0 of a dq program one fully masked key block. Where causality by index is all
    the mask, the blocks wholly past the program's keys (dk, dv: the first two query blocks
    of each head run first) or before a warpgroup's queries (dq) run in a loop with no mask
    code, as in the one-warpgroup kernels.
Cost a program, per looped block: bytes 2 x 64 x D x 2 (two tiles) + its rows, once for 128
owned rows; FLOPs 2 x (4 x 64 x 64 x D) (dk, dv: four products each warpgroup; dq: three) and
the looped block's rotation once. Shared memory: each warpgroup's two tiles, two slots of two
looped tiles, the swap matrix (not with column slices), rows: about 70 KiB at D = 64, 160 KiB at
D = 128.

Not yet done (speed; timing on an H200 decides): asynchronous wgmma, ping-pong between the two
warpgroups.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_backward as backward
from rove_jax.kernels import fused_hopper_backward_io as io
from rove_jax.kernels import fused_hopper_backward_pipe as pipe
from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels.fused_tiles import CONST_ROWS, Plan

W = pipe.W  # compute warpgroups a program
THREAD = "wg"  # plgpu.kernel's thread axis: one warpgroup a thread
BLOCK = backward.BLOCK  # rows of each warpgroup's key block and of a query block


def problem(T: int, S: int) -> str | None:
  """None when the two-warpgroup kernels take T queries and S keys; else the reason."""
  for name, n in (("query length T", T), ("kv length S", S)):
    if n % (W * BLOCK):
      return f"{name}={n} is not a multiple of {W * BLOCK} (backward_wgs={W} x {BLOCK} rows)"
  return None


def _scratch(plan: Plan, D: int, dt, n_loop: int, n_own: int, tabled: bool, queries_looped: bool):
  """Shared memory of either kernel: constants, swap; each warpgroup's two tiles [W, 2, b, D],
  its rows [W, 3, b] and segment ids; two slots of two looped tiles, their rows and segment
  ids; barriers (constants and swap; each warpgroup's n_own copies; a slot's n_loop copies; a
  looped block rotated; both done with the loop)."""
  b = BLOCK
  smem = lambda shape: plgpu.SMEM(shape, dt, transforms=rotation.transforms(plan))
  return [
    plgpu.SMEM((CONST_ROWS, D), jnp.float32),
    rotation.swap_scratch(plan, D, smem),
    smem((W, 2, b, D)),
    plgpu.SMEM((W, 3, b), jnp.float32),
    plgpu.SMEM((W, b), jnp.int32),
    smem((2, 2, b, D)),  # a slot's looped tiles (rotated in place; after the loop: staging)
    plgpu.SMEM((2, 3, b), jnp.float32),
    plgpu.SMEM((2, b), jnp.int32),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=n_own * W),
    plgpu.Barrier(num_barriers=2 * n_loop),
    plgpu.Barrier(num_arrivals=W),
    plgpu.Barrier(num_arrivals=W),
    io.loop_tables(plan, b, tabled, queries_looped),  # the looped blocks' tables
    plgpu.Barrier(num_arrivals=W, num_barriers=2),  # a slot consumed (producer only)
    plgpu.Barrier(num_barriers=2),  # a slot turned (a producer that turns)
  ]


def _turn_shared(rot, wg, tiles_s, rows, second: bool, queries: bool) -> None:
  """A looped block's turns in place, shared by the two warpgroups: with a second tile turned
  (RoVE's v, or dO) one tile each; else the first tile's rows halved between them where the
  rotation loads 16 bytes a thread (bf16 turns by copied tables: Rotation.flat), the
  WGMMA layout elsewhere needing all 64 rows in one warpgroup. rows: the positions or tables
  (io.looped_rows); queries: q (scaled) and dO rather than k and v."""
  first_s, second_s = tiles_s
  if second or not rot.flat(rows):
    pl.when(wg == 0)(lambda: rot.to([(first_s, first_s)], rows, scale_first=queries))
    if second:
      pl.when(wg == 1)(lambda: rot.to([(second_s, second_s)], rows))
    return
  half = BLOCK // W
  for i in range(W):  # static i: every slice of a swizzled tile static
    part = pl.ds(i * half, half)
    x = first_s.at[part]
    pl.when(wg == i)(lambda x=x, part=part: rot.to([(x, x)], rows.at[part], scale_first=queries))


def _run(plan: Plan, part: str, body, out_type, scratch, grid, args):
  producer = plan.backward_producer
  return tiles.run_kernel(
    plan,
    tiles.named(plan, f"{part}_{W}wg" + ("_tma" if producer else ""), body),
    out_type,
    scratch,
    grid[0],
    grid[1],
    *args,
    num_threads=W + (1 if producer else 0),
    thread_name=THREAD,
  )


def _meet(bar) -> None:
  plgpu.barrier_arrive(bar)
  plgpu.barrier_wait(bar)


def dq(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T):
  """dq [B, T, H, D] in the inputs' dtype, as fused_hopper_backward's."""
  B, T, H, D, S, K = tiles.dims(plan, q_BTHD, k_BSKD)
  arrays = (q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T)
  args, tabled, n_loop = io.operands(plan, small, arrays, queries_looped=False, wgs=W)
  scratch = _scratch(plan, D, q_BTHD.dtype, n_loop, 6, tabled, False)
  body = functools.partial(_dq_body, plan, S // BLOCK, H // K, tabled)
  out_type = jax.ShapeDtypeStruct((B, T, H, D), q_BTHD.dtype)
  grid = ((H, T // (W * BLOCK), B), ("heads", "q", "batch"))
  return _run(plan, "dq", body, out_type, scratch, grid, args)


def dkv(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T):
  """(dk [B, S, K, D], dv [B, S, K, D]) in the inputs' dtype, as fused_hopper_backward's."""
  B, T, H, D, S, K = tiles.dims(plan, q_BTHD, k_BSKD)
  plan = pipe.with_producer(plan, D, queries_looped=True)
  arrays = (q_BTHD, k_BSKD, v_BSKD, do_BTHD, rows_BH3T)
  args, tabled, n_loop = io.operands(plan, small, arrays, queries_looped=True, wgs=W)
  scratch = _scratch(plan, D, q_BTHD.dtype, n_loop, 4, tabled, True)
  body = functools.partial(_dkv_body, plan, T // BLOCK, H // K, tabled)
  out_type = [jax.ShapeDtypeStruct((B, S, K, D), k_BSKD.dtype)] * 2
  grid = ((K, S // (W * BLOCK), B), ("kv_heads", "kv", "batch"))
  return _run(plan, "dkv", body, out_type, scratch, grid, args)


def _turners(rot, wg, loop_s, rows_of, second: bool, queries: bool):
  """(turn_shared(slot), turn_part(slot, rows)) of a kernel's looped blocks (pipe.Pipe): the
  first tile (q scaled, with queries) and the second where it turns (second), by rows_of(slot)
  (io.looped_rows)."""
  tiles_of = lambda slot: (loop_s.at[slot, 0], loop_s.at[slot, 1])

  def shared(slot):
    _turn_shared(rot, wg, tiles_of(slot), rows_of(slot), second, queries)

  def part(slot, rows):
    first_s, second_s = tiles_of(slot)
    xs = [first_s.at[rows]] + ([second_s.at[rows]] if second else [])
    rot.to([(x, x) for x in xs], rows_of(slot).at[rows], scale_first=queries)

  return shared, part


def _waiter(bar, n: int):
  """A function waiting on bar.at[0 .. n - 1]."""

  def wait():
    for i in range(n):
      plgpu.barrier_wait(bar.at[i])

  return wait


def _take_own(copies, bar, first, wait_fixed) -> None:
  """A warpgroup's own tiles and rows: each (source, destination) copy issued on
  bar.at[first + n]; then the constants (wait_fixed) and they waited for."""
  for n, (src, dst) in enumerate(copies):
    plgpu.copy_gmem_to_smem(src, dst, bar.at[first + n])
  wait_fixed()
  for n in range(len(copies)):
    plgpu.barrier_wait(bar.at[first + n])


def _dq_body(plan: Plan, nk: int, G: int, tabled: bool, *refs):
  """A warpgroup's 64 query rows of the program's 128, against every key block they see (and,
  with plan.backward_producer, the warpgroup that copies and turns the key blocks)."""
  r, (dq_ref,), scr = io.unpack(plan, refs, 1, tabled)
  (consts_s, swap_s, own_s, own_rows, own_seg, loop_s, loop_rows, loop_seg) = scr[:8]
  fixed_bar, own_bar, loop_bar, rotated_bar, done_bar, loop_tabs, consumed, turned = scr[8:]
  ops = tiles.Ops(plan.interpret)
  rot = rotation.of(plan, ops, consts_s, swap_s)
  wg = lax.axis_index(THREAD)
  b, h, qb = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q")
  kh = lax.div(h, jnp.int32(G))
  D = own_s.shape[-1]
  constants = rotation.constant_copies(plan, (r["consts"], consts_s), (r["swap"], swap_s))
  wait_fixed = _waiter(fixed_bar, len(constants))  # the compute warpgroups' and the producer's
  # The key blocks the program's last query row sees (all of them without causality).
  n_blocks = tiles.last_key_block(plan, qb * (W * BLOCK) + BLOCK, nk) + 1

  def fetch(j, slot):
    bufs = (loop_s, loop_rows, loop_seg, loop_tabs)
    io.fetch_keys(plan, r, bufs, loop_bar, (b, kh, j), slot)

  rows_of = lambda slot: io.looped_rows(r, loop_rows.at[slot, 0], loop_tabs.at[slot])
  turns = _turners(rot, wg, loop_s, rows_of, plan.rotate_values, False)
  n_loop = io.loop_copies(plan, False, tabled)
  bars = pipe.Bars(loop_bar, n_loop, rotated_bar, consumed, turned)
  blocks = pipe.Pipe(plan, wg, n_blocks, nk, BLOCK, fetch, *turns, bars)

  def compute():
    q_start = qb * (W * BLOCK) + wg * BLOCK
    rows = pl.ds(q_start, BLOCK)
    tiles.copy_from_first(wg, constants, fixed_bar)
    q_own, do_own, rows_own = own_s.at[wg, 0], own_s.at[wg, 1], own_rows.at[wg]
    copies = [
      (r["q"].at[b, rows, h], q_own),
      (r["do"].at[b, rows, h], do_own),
      (r["q_rows"].at[b, h, :, rows], rows_own),  # position, lse, delta
    ]
    if plan.segmented:
      copies.append((r["q_seg"].at[b, rows], own_seg.at[wg]))
    _take_own(copies, own_bar, wg * 6, wait_fixed)
    pairs = [(q_own, q_own)] + ([(do_own, do_own)] if plan.rotate_output else [])
    rot.to(pairs, rows_own.at[0], scale_first=True)  # in place
    plgpu.commit_smem()
    stats = (ops.load(rows_own.at[1], 1), ops.load(rows_own.at[2], 1))  # lse, delta
    q_seg = ops.load(own_seg.at[wg], 1) if plan.segmented else None

    def step(j, acc, masked=True):
      slot = lax.rem(j, 2)
      blocks.ready(j, D)
      kv_seg = ops.load(loop_seg.at[slot], 0) if plan.segmented else None
      operands = (q_own, do_own, loop_s.at[slot, 0], loop_s.at[slot, 1])
      starts = (q_start, j * BLOCK)
      segs = (q_seg, kv_seg)
      acc = backward.query_products(ops, plan, acc, operands, starts, segs, stats, masked)
      blocks.done(j)
      return acc

    # Each warpgroup runs its key blocks wholly before its first query without the mask
    # (tiles.key_block_loop): one more for warpgroup 1, but both run all n_blocks, in order.
    zeros = ops.wgmma_layout(jnp.zeros((BLOCK, D), jnp.float32))
    acc = tiles.key_block_loop(plan, q_start, n_blocks, step, zeros)
    _meet(done_bar)  # the loop buffers are free: each warpgroup takes its slot as staging
    dq_r = acc * rotation.query_scale(ops, consts_s, acc.shape)
    rot.f32(dq_r, rows_own.at[0], loop_s.at[wg], q_own, inverse=True)
    tiles.store((q_own, dq_ref.at[b, rows, h]))

  blocks.run(compute, D, wait_fixed)


def _dkv_body(plan: Plan, nq: int, G: int, tabled: bool, *refs):
  """A warpgroup's 64 keys of the program's 128, against every query block of its G heads (and,
  with plan.backward_producer, the warpgroup that copies and turns the query blocks)."""
  r, (dk_ref, dv_ref), scr = io.unpack(plan, refs, 2, tabled)
  (consts_s, swap_s, own_s, own_rows, own_seg, loop_s, loop_rows, loop_seg) = scr[:8]
  fixed_bar, own_bar, loop_bar, rotated_bar, done_bar, loop_tabs, consumed, turned = scr[8:]
  ops = tiles.Ops(plan.interpret)
  rot = rotation.of(plan, ops, consts_s, swap_s)
  bq, dt, D = BLOCK, own_s.dtype, own_s.shape[-1]
  wg = lax.axis_index(THREAD)
  b, kh, kb = lax.axis_index("batch"), lax.axis_index("kv_heads"), lax.axis_index("kv")
  constants = rotation.constant_copies(plan, (r["consts"], consts_s), (r["swap"], swap_s))
  wait_fixed = _waiter(fixed_bar, len(constants))  # the compute warpgroups' and the producer's
  # The query blocks from the one holding the program's first key (causal), for each head.
  first = lax.div(kb * (W * BLOCK), jnp.int32(bq)) if plan.causal else jnp.int32(0)
  per_head = nq - first
  n_steps = G * per_head
  # Both warpgroups' keys reach into the first two query blocks of each head (W * BLOCK keys):
  # those run first with the mask, the rest without. Not at D = 128, where the second loop's
  # code takes registers this kernel (at 255) does not have, and spills.
  block_of, n_masked = backward.query_block_order(plan, G, first, per_head, n_diag=W, split=D <= 64)

  def fetch(t, slot):
    g, qb = block_of(t)
    where = (b, kh * G + g, qb * bq)
    bufs = (loop_s, loop_rows, loop_seg, loop_tabs)
    io.fetch_queries(plan, r, bufs, loop_bar, where, slot)

  rows_of = lambda slot: io.looped_rows(r, loop_rows.at[slot, 0], loop_tabs.at[slot])
  turns = _turners(rot, wg, loop_s, rows_of, plan.rotate_output, True)
  n_loop = io.loop_copies(plan, True, tabled)
  bars = pipe.Bars(loop_bar, n_loop, rotated_bar, consumed, turned)
  # n_steps >= G >= 1: every key block has a query block at or after it; a second where
  # G * nq > 1.
  blocks = pipe.Pipe(plan, wg, n_steps, G * nq, BLOCK, fetch, *turns, bars)

  def compute():
    k_start = kb * (W * BLOCK) + wg * BLOCK
    keys = pl.ds(k_start, BLOCK)
    tiles.copy_from_first(wg, constants, fixed_bar)
    k_own, v_own, kv_pos = own_s.at[wg, 0], own_s.at[wg, 1], own_rows.at[wg, 0]
    copies = [(r["k"].at[b, keys, kh], k_own), (r["v"].at[b, keys, kh], v_own)]
    copies.append((r["kv_pos"].at[b, keys], kv_pos))
    if plan.segmented:
      copies.append((r["kv_seg"].at[b, keys], own_seg.at[wg]))
    _take_own(copies, own_bar, wg * 4, wait_fixed)
    pairs = [(k_own, k_own)] + ([(v_own, v_own)] if plan.rotate_values else [])
    rot.to(pairs, kv_pos)  # in place
    plgpu.commit_smem()
    kv_seg = ops.load(own_seg.at[wg], 1) if plan.segmented else None

    def step(t, carry, masked=True):
      slot = lax.rem(t, 2)
      blocks.ready(t, D)
      starts = (block_of(t)[1] * bq, k_start)
      operands = (k_own, v_own, loop_s.at[slot, 0], loop_s.at[slot, 1])
      rows = (loop_rows.at[slot], loop_seg.at[slot])
      carry = backward.key_products(ops, plan, carry, operands, starts, kv_seg, rows, masked)
      blocks.done(t)
      return carry

    zeros = ops.wgmma_layout(jnp.zeros((BLOCK, D), jnp.float32))
    dk_acc, dv_acc = backward.diagonal_first_loop(n_masked, n_steps, step, (zeros, zeros))
    _meet(done_bar)  # the query buffers are free: each warpgroup takes its slot as staging
    stage = loop_s.at[wg]
    rot.f32(dk_acc, kv_pos, stage, k_own, inverse=True)
    if plan.rotate_values:
      rot.f32(dv_acc, kv_pos, stage, v_own, inverse=True)
    else:
      v_own[...] = dv_acc.astype(dt)
    tiles.store((k_own, dk_ref.at[b, keys, kh]), (v_own, dv_ref.at[b, keys, kh]))

  blocks.run(compute, D, wait_fixed)
