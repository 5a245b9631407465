"""The Hopper fused kernel's forward pass with one warpgroup a program
(rove_jax.kernels.fused_hopper has the design; fused_hopper_ws the two-warpgroup forward,
which `forward` hands plan.compute_wgs > 1): a query block of bq = 64 rows of one head against
its kv head's key blocks, each turned in shared memory as it arrives, the output turned back
before it is stored.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels import fused_hopper_ws
from rove_jax.kernels.fused_tiles import CONST_ROWS, Plan

ROWS = 64  # wgmma's M: a key block is turned this many rows at a time (tables computed)


def forward(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD):
  """(o [B, T, H, D] in q.dtype, logsumexp [B, H, T] float32; +inf for rows that see no
  key)."""
  if plan.compute_wgs > 1:
    return fused_hopper_ws.forward(plan, small, q_BTHD, k_BSKD, v_BSKD)
  B, T, H, D, S, K = tiles.dims(plan, q_BTHD, k_BSKD)
  bq, bk, dt = plan.bq, plan.bk, q_BTHD.dtype
  smem = lambda shape, dtype=dt: plgpu.SMEM(shape, dtype, transforms=rotation.transforms(plan))
  n_seg = 2 if plan.segmented else 0
  # Where the rotation allows (rotation.in_place) q, k and v are rotated in their own buffers
  # and the output staged in q's: no rotated copies and no staging tiles, 48 KiB less at D = 64
  # and 64 at D = 128, which lets two programs share an SM (two warps a sub-partition).
  in_place = rotation.in_place(plan, D)
  tabled = rotation.tables_in_one_slot(plan, D, forward=True)
  none = tiles.placeholder()
  scratch = [
    plgpu.SMEM((CONST_ROWS, D), jnp.float32),
    rotation.swap_scratch(plan, D, smem),  # constants, swap matrix
    smem((bq, D)),
    plgpu.SMEM((bq,), jnp.float32),  # q (then o), q positions
    smem((2, bk, D)),
    smem((2, bk, D)),
    rotation.table_rows(plan, (1, bk), True) if tabled else plgpu.SMEM((2, bk), jnp.float32),
    *([none] * 2 if in_place else [smem((bk, D))] * 2),  # rotated k, v
    none if in_place else smem((2, bq, D)),
    plgpu.SMEM((bq,), jnp.float32),  # rotated q, then the output's staging; lse
    plgpu.SMEM((bq,), jnp.int32),
    plgpu.SMEM((2, bk), jnp.int32),  # segment ids
    plgpu.Barrier(num_barriers=4 + n_seg // 2),  # constants, swap, q, q rows (+ segments)
    plgpu.Barrier(num_barriers=2 * (3 + n_seg // 2)),  # k, v, kv rows (+ segments) a slot
    plgpu.Barrier(num_barriers=1),  # the tables' one slot
  ]
  args, out_type = tiles.forward_io(plan, small, q_BTHD, k_BSKD, v_BSKD)
  if tabled:  # the kv positions' cos and sin rows in their place
    args[3] = rotation.key_tables(args[3], args[0], plan)
  body = functools.partial(_forward_body, plan, S // bk, H // K, in_place, tabled)
  return tiles.run_kernel(
    plan,
    tiles.named(plan, "fwd", body),
    out_type,
    scratch,
    (H, T // bq, B),
    ("heads", "q", "batch"),
    *args,
  )


def _forward_body(plan: Plan, nk: int, G: int, in_place: bool, tabled: bool, *refs):
  """One query block of one head. refs: the inputs (constants, swap, position rows (with
  tabled: the kv positions' tables), segment rows when segmented, q, k, v), the outputs (o,
  lse) and the scratch of `forward`; with in_place q, k and v are rotated in their own buffers
  (a k/v slot is refilled only after its block's products) and the output is staged in q's;
  with tabled the key blocks' tables arrive in one slot (rotation.tables_in_one_slot)."""
  n_in = 9 if plan.segmented else 7
  ins, (o_ref, lse_ref), scr = refs[:n_in], refs[n_in : n_in + 2], refs[n_in + 2 :]
  consts_ref, swap_ref, q_pos_ref, kv_pos_ref = ins[:4]
  q_seg_ref, kv_seg_ref = ins[4:6] if plan.segmented else (None, None)
  q_ref, k_ref, v_ref = tiles.unpacked(plan, *ins[-3:])
  (
    consts_s,
    swap_s,
    q_s,
    qpos_s,
    k_s,
    v_s,
    kvpos_s,
    kr_s,
    vr_s,
    stage_s,
    lse_s,
    qseg_s,
    kvseg_s,
    fixed_bar,
    kv_bar,
    tab_bar,
  ) = scr
  ops = tiles.Ops(plan.interpret)
  bq, bk = plan.bq, plan.bk
  b, h, qb = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q")
  kh = lax.div(h, jnp.int32(G))
  q_start = qb * bq
  rows = pl.ds(q_start, bq)
  n_kv_bar = (2 if tabled else 3) + (1 if plan.segmented else 0)

  copies = rotation.constant_copies(plan, (consts_ref, consts_s), (swap_ref, swap_s))
  copies += [(q_ref.at[b, rows, h], q_s), (q_pos_ref.at[b, rows], qpos_s)]
  if plan.segmented:
    copies.append((q_seg_ref.at[b, rows], qseg_s))
  for n, (src, dst) in enumerate(copies):
    plgpu.copy_gmem_to_smem(src, dst, fixed_bar.at[n])

  def fetch(j, slot):
    srcs = (k_ref, v_ref, None if tabled else kv_pos_ref, kv_seg_ref)
    dsts = lambda s: (k_s.at[s], v_s.at[s], kvpos_s.at[s], kvseg_s.at[s])
    tiles.fetch_keys(plan, srcs, dsts, kv_bar, b, kh, j, slot)

  fetch_tables = lambda j: tiles.fetch_tables(kv_pos_ref, kvpos_s, tab_bar.at[0], b, j, bk)
  n_blocks = tiles.last_key_block(plan, q_start, nk) + 1
  tiles.first_key_fetches(fetch, nk, n_blocks, fetch_tables if tabled else None)
  for n in range(len(copies)):
    plgpu.barrier_wait(fixed_bar.at[n])

  rot = rotation.of(plan, ops, consts_s, swap_s)
  # Rotated q: in place, or in the staging tiles, free until the output's rotation.
  q_r_s = q_s if in_place else stage_s.at[0]
  rot.to([(q_s, q_r_s)], qpos_s, scale_first=True)
  plgpu.commit_smem()
  q_seg = ops.load(qseg_s, 1) if plan.segmented else None

  def step(j, carry, masked=True):
    slot = lax.rem(j, 2)
    tiles.wait_block(kv_bar, slot, n_kv_bar, tab_bar.at[0] if tabled else None)
    rows = kvpos_s.at[0 if tabled else slot]
    # In 64-row pieces (wgmma's M), which halves the registers a 128-key block's tables and
    # products take at once; with tables copied (bfloat16 pairs, 16 bytes a thread) the whole
    # block at once: half the stores, each of which Mosaic GPU fences with warpgroup barriers.
    k_r, v_r = (k_s.at[slot], v_s.at[slot]) if in_place else (kr_s, vr_s)
    srcs = [k_s.at[slot]] + ([v_s.at[slot]] if plan.rotate_values else [])
    rows_at_once = bk if tabled else ROWS
    for i in range(bk // rows_at_once):
      part = pl.ds(i * rows_at_once, rows_at_once)
      pieces = [x.at[part] for x in srcs]
      # In place each pair is one ref, which tells the rotation not to copy pass-through dims.
      dsts = pieces if in_place else [x.at[part] for x in (k_r, v_r)]
      pairs = list(zip(pieces, dsts))
      rot.to(pairs, rows.at[part])
    values = v_r if plan.rotate_values else v_s.at[slot]
    kv_seg = ops.load(kvseg_s.at[slot], 0) if plan.segmented else None
    plgpu.commit_smem()
    if tabled:  # every warp has turned the block: its tables' slot is free
      pl.when(j + 1 < n_blocks)(lambda: fetch_tables(j + 1))
    s = ops.mma(q_r_s, k_r, transpose_b=True)  # [bq, bk]
    mask = (
      tiles.visible(ops, plan, q_start, j * bk, q_seg, kv_seg, s.shape, keys_in_rows=False)
      if masked
      else None
    )
    carry = tiles.softmax_step(ops, carry, s, mask, values)
    pl.when(j + 2 < n_blocks)(lambda: fetch(j + 2, slot))
    return carry

  start = tiles.softmax_start(ops, bq, q_s.shape[1])
  o, lse = tiles.softmax_end(tiles.key_block_loop(plan, q_start, n_blocks, step, start))
  if plan.rotate_output:  # its tables from the positions again, not held across the loop
    rot.f32(o, qpos_s, q_s if in_place else stage_s, q_s, inverse=True)
  else:
    q_s[...] = o.astype(q_s.dtype)
  lse_s[...] = lse
  tiles.store((q_s, o_ref.at[b, rows, h]), (lse_s, lse_ref.at[b, h, rows]))
