"""What the Hopper fused kernel's backward kernels (rove_jax.kernels.fused_hopper_backward and
its two-warpgroup twins in rove_jax.kernels.fused_hopper_backward_ws) read: their inputs in
order (`kernel_args`, `unpack`), each query's position, lse and delta rows (`query_rows`), the
TMA copies of a looped block (`fetch_keys`, `fetch_queries`, `loop_copies`), and where the
looped blocks' cos and sin come copied beside them (`copies_tables`, `loop_tables`,
`looped_rows`) rather than computed from their positions.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, D head dim.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels.fused_tiles import Plan


def copies_tables(plan: Plan, D: int, *, queries_looped: bool, wgs: int) -> bool:
  """Whether a backward kernel takes its looped blocks' cos and sin by copy
  (rotation.tables_copied): every dk, dv kernel (queries_looped) and the two-warpgroup dq,
  whose programs an SM their registers bound, so the tables' shared memory leaves them as they
  are; not the one-warpgroup dq, whose three programs an SM it would make two."""
  return rotation.tables_copied(plan, D) and (queries_looped or wgs == 2)


def kernel_args(plan: Plan, small, *arrays, tables: str | None = None) -> list:
  """The backward kernels' inputs in their refs' order (`unpack`): constants, swap matrix,
  kv positions, q and kv segment ids when segmented, then arrays (q, k, v, dO, q_rows), and
  with tables ("queries" or "keys") the looped blocks' tables (rotation.key_tables of those
  positions). small: the kernel's (constants, swap, positions, segments); q_rows:
  `query_rows`."""
  consts, swap, q_pos, kv_pos, q_seg, kv_seg = small
  args = [consts, swap, kv_pos] + ([q_seg, kv_seg] if plan.segmented else []) + list(arrays)
  if tables is not None:
    pos = q_pos if tables == "queries" else kv_pos
    args.append(rotation.key_tables(pos, consts, plan, scaled=tables == "queries"))
  return args


def operands(plan: Plan, small, arrays, *, queries_looped: bool, wgs: int, one_slot=False):
  """(inputs, tabled, loop copies) of a backward kernel: `kernel_args` (with the looped blocks'
  tables where `copies_tables` or one_slot), whether it takes tables, and `loop_copies`.
  arrays: (q, k, v, dO, q_rows); queries_looped: the dk, dv kernels; wgs: warpgroups a
  program; one_slot: the key blocks' tables copied into one slot of their own
  (rotation.tables_in_one_slot), not beside each block."""
  D = arrays[0].shape[-1]
  tabled = one_slot or copies_tables(plan, D, queries_looped=queries_looped, wgs=wgs)
  tables = ("queries" if queries_looped else "keys") if tabled else None
  args = kernel_args(plan, small, *arrays, tables=tables)
  return args, tabled, loop_copies(plan, queries_looped, tabled, one_slot)


def loop_copies(plan: Plan, queries_looped: bool, tabled: bool, one_slot: bool = False) -> int:
  """The TMA copies (each on its own barrier) of a looped block: two tiles, the rows
  (positions, or for queries `query_rows`; none for keys whose tables come in one_slot),
  segment ids when segmented, and with tabled a query block's tables (a key block's take its
  positions' place)."""
  rows = 0 if one_slot else 1
  return 2 + rows + (1 if plan.segmented else 0) + (1 if tabled and queries_looped else 0)


def loop_tables(plan: Plan, n: int, tabled: bool, queries_looped: bool, slots: int = 2):
  """The shared memory of the looped blocks' tables, [slots, n, 2 r] (rotation.table_dtype),
  with tabled; a placeholder elsewhere."""
  if not tabled:
    return tiles.placeholder()
  return rotation.table_rows(plan, (slots, n), True, scaled=queries_looped)


def query_rows(q_pos_BT, lse_BHT, delta_BHT):
  """[B, H, 3, T] float32: each query's position, logsumexp and delta = rowsum(dO . O), one
  row each, so that a query block's three rows arrive by one TMA copy (each copy costs its
  issue and a warpgroup barrier in the loop that fetches them)."""
  pos_BHT = jnp.broadcast_to(q_pos_BT[:, None].astype(jnp.float32), lse_BHT.shape)
  return jnp.stack([pos_BHT, lse_BHT, delta_BHT], axis=2)


def unpack(plan: Plan, refs, n_out: int, tabled: bool):
  """(inputs dict, outputs, scratch) of either kernel's refs (`kernel_args`' order; with
  tabled the looped blocks' tables under "tables")."""
  names = ["consts", "swap", "kv_pos"] + (["q_seg", "kv_seg"] if plan.segmented else [])
  names += ["q", "k", "v", "do", "q_rows"] + (["tables"] if tabled else [])
  n_in = len(names)
  ins, outs, scr = refs[:n_in], refs[n_in : n_in + n_out], refs[n_in + n_out :]
  r = dict(zip(names, ins))
  r["q"], r["k"], r["v"] = tiles.unpacked(plan, r["q"], r["k"], r["v"])
  return r, outs, scr


def looped_rows(r, pos_ref, tables_ref):
  """What a looped block is rotated by (Rotation.to's pos_ref): its tables in shared memory
  where they are copied (r has "tables"), else its positions."""
  return tables_ref if "tables" in r else pos_ref


def fetch_keys(plan: Plan, r, bufs, bar, where, slot, one_slot: bool = False) -> None:
  """tiles.fetch_keys into the dq kernels' double buffers: k and v into tiles [2, 2, bk, D]
  (slot, then k or v), positions into rows [2, 3, bk] (row 0) or where they are copied the
  keys' tables in their place into tables [2, bk, 2 r] (with one_slot neither: the tables
  come by tiles.fetch_tables), segment ids (when segmented) into [2, bk]. where: (example,
  kv head, key block)."""
  tiles_s, rows_s, seg_s, tabs_s = bufs
  if one_slot:
    srcs = (r["k"], r["v"], None, r.get("kv_seg"))
    dsts = lambda s: (tiles_s.at[s, 0], tiles_s.at[s, 1], None, seg_s.at[s])
  elif "tables" in r:
    srcs = (r["k"], r["v"], r["tables"], r.get("kv_seg"))
    dsts = lambda s: (tiles_s.at[s, 0], tiles_s.at[s, 1], tabs_s.at[s], seg_s.at[s])
  else:
    srcs = (r["k"], r["v"], r["kv_pos"], r.get("kv_seg"))
    dsts = lambda s: (tiles_s.at[s, 0], tiles_s.at[s, 1], rows_s.at[s, 0], seg_s.at[s])
  tiles.fetch_keys(plan, srcs, dsts, bar, *where, slot)


def fetch_queries(plan: Plan, r, bufs, bar, where, slot) -> None:
  """Issues the TMA copies of one query block of one head into `slot` of the dk, dv kernels'
  double buffers: q and dO into tiles [2, 2, bq, D] (slot, then q or dO), positions, lse and
  delta into rows [2, 3, bq] (one copy: `query_rows`), segment ids (when segmented) into
  [2, bq], and where they are copied the queries' tables into [2, bq, 2 r]; each copy on its
  own barrier, bar.at[slot * n + i] for the i-th of n. where: (example, head, first query
  row)."""
  tiles_s, rows_s, seg_s, tabs_s = bufs
  b, h, start = where
  rows = pl.ds(start, plan.bq)
  pairs = [
    (r["q"].at[b, rows, h], tiles_s.at[slot, 0]),
    (r["do"].at[b, rows, h], tiles_s.at[slot, 1]),
    (r["q_rows"].at[b, h, :, rows], rows_s.at[slot]),
  ]
  if plan.segmented:
    pairs.append((r["q_seg"].at[b, rows], seg_s.at[slot]))
  if "tables" in r:
    pairs.append((r["tables"].at[b, rows], tabs_s.at[slot]))
  for n, (src, dst) in enumerate(pairs):
    plgpu.copy_gmem_to_smem(src, dst, bar.at[slot * len(pairs) + n])
