"""The Hopper fused kernel's forward pass with several warpgroups a program (part of
FlashAttention-3's structure): `fused_hopper.kernel(compute_wgs=2)` runs it; the one-warpgroup
forward of rove_jax.kernels.fused_hopper stays the default. The backward pass is the same for
both (rove_jax.kernels.fused_hopper_backward).

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, D head dim.

What runs, and why:
  * One program a (block of 2 x 64 query rows, example, head): two compute warpgroups
    (plgpu.kernel's threads), each owning 64 of the rows (wgmma's native M) with its own q
    tile, accumulator and softmax statistics, as FlashAttention-3 does.
  * The two share each key/value block of bk = 128 keys: it is TMA-copied once a program
    (double-buffered: the copy of block j + 1 is issued as block j's products start) and
    rotated once a program, in place in its TMA buffer. Each warpgroup rotates half of the
    block's rows (its cos/sin tables; k and, RoVE, v), writes them back, and the two meet at a
    barrier before either reads the whole block. Splitting rows rather than giving k to one
    warpgroup and v to the other keeps the halves equal for RoPE (where only k turns) as for
    RoVE, computes each key's cos/sin once rather than twice, and makes each share one
    native-M [64, D] x [D, D] swap wgmma; hence bk = 128 = 2 x 64 and S a multiple of 128.
    Rotating in place (no second, rotated copy of the block) is what lets D = 128 fit.
  * With slices at D = 64 (rotation.tables_copied) the block's cos and sin come with it: XLA
    computes them once a call from the key positions ([B, S, 2 r] float32, bfloat16 with
    bf16_turns: fused_hopper_rotation.key_tables), and each block's rows are TMA-copied in
    place of its positions. The rotation then loads them (two shared-memory loads a row's
    piece) instead of computing a sine and a cosine for every rotated element in every program,
    which was most of a share's rotation work; the block's reads from L2 double (the tables are
    as large as k and v at r = 32; half that in bfloat16), and shared memory holds one program
    an SM, as the registers already did.
  * That barrier also tells whoever issues the key/value copies that both warpgroups are done
    with the block before, whose buffer is then refilled. Without `producer` compute
    warpgroup 0 issues them. With `producer` a third warpgroup does (warp specialisation): it
    waits on a per-slot "consumed" barrier both compute warpgroups arrive at after their
    products, and hands registers to them (plgpu.set_max_registers). With bf16 turns and
    copied tables it also turns each block as it lands (`producer_turns`) and tells the
    compute warpgroups on a per-slot "turned" barrier: their loop then holds no turn (RoVE's
    the same as RoPE's), the turns overlap their products, and the producer runs a block
    ahead.
  * q's rotation (each warpgroup its own), the masks, the online softmax and the output
    rotation are the one-warpgroup kernel's; the output's float32 pair swap by the swap matrix
    passes its two bfloat16 pieces one after the other through the warpgroup's q tile (no
    staging buffer). Pairs are swapped as in the one-warpgroup kernel: by column slices where
    the rotary allows (slice_swap), by the swap matrix elsewhere
    (rove_jax.kernels.fused_hopper_rotation); every rotation here is in place.

Cost a program (n key blocks read; the causal mask leaves about half of the blocks): it reads
2 x 64 query rows and 2 x 128 x D x 2 bytes of k and v a block, which the one-warpgroup
kernel reads once for each 64 query rows: key/value bytes a query row halve. FLOPs a block:
q.k^T and p.v 4 x 128 x 128 x D (unchanged a query row); the k rotation 2 x 128 x D x D and
as much again for v (RoVE), a query row half the one-warpgroup kernel's, where they equal q.k^T
and p.v at D = 64; with slice_swap none (about 6 elementwise FLOPs an element rotated). Once a
program: q 2 x 128 x D x D, the output (RoVE) twice that, none with slice_swap. Shared memory
(bfloat16 tiles, 2 bytes an element): the swap matrix D x D (none with slice_swap), q 2 x 64 x D,
k and v 2 slots x 2 x 128 x D, and a few KiB of constants and rows; at D = 128 that is within
the 227 KiB a block may use because the block is rotated in place. With the tables, 2 slots x
128 x 2 r x 4 bytes more (64 KiB at D = 64) and as many bytes read a block.

Interpret mode (Mosaic GPU's interpreter, jax 0.10) runs each warpgroup as a thread and checks
every barrier: a warpgroup that waits on a barrier at all waits on every phase of it, which is
why the producer drains the last two "consumed" phases.

Not yet done (speed, not numerics; timing on an H200 decides): ping-pong scheduling between the
two compute warpgroups (FA3's schedule barrier: one's softmax under the other's wgmma),
asynchronous wgmma overlapping the softmax, a deeper key/value pipeline, 64-key blocks (a
32-row share is below wgmma's M). (The backward kernels share blocks the same way:
rove_jax.kernels.fused_hopper_backward_ws.)
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels.fused_tiles import CONST_ROWS, Plan

BLOCK_KV = 128  # shared key/value block: each of two compute warpgroups rotates 64 rows
THREAD = "wg"  # plgpu.kernel's thread axis: one warpgroup a thread


def problem(T: int, S: int, compute_wgs: int, bq: int) -> str | None:
  """None when the multi-warpgroup forward runs T queries against S keys; else the reason."""
  rows = compute_wgs * bq
  if T % rows:
    return f"query length T={T} is not a multiple of {rows} (compute_wgs={compute_wgs} x {bq})"
  if S % BLOCK_KV:
    return f"kv length S={S} is not a multiple of {BLOCK_KV} (the block compute_wgs shares)"
  return None


def forward(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD):
  """(o [B, T, H, D] in q.dtype, logsumexp [B, H, T] float32), as fused_hopper_forward.forward."""
  B, T, H, D, S, K = tiles.dims(plan, q_BTHD, k_BSKD)
  W, bq, bk, dt = plan.compute_wgs, plan.bq, plan.bk, q_BTHD.dtype
  assert bk == BLOCK_KV == W * bq, (W, bq, bk)
  smem = lambda shape: plgpu.SMEM(shape, dt, transforms=rotation.transforms(plan))
  tabled = rotation.tables_copied(plan, D)
  scratch = [
    plgpu.SMEM((CONST_ROWS, D), jnp.float32),
    rotation.swap_scratch(plan, D, smem),
    smem((W, bq, D)),  # each warpgroup's q (then rotated q, output staging, o)
    plgpu.SMEM((W, bq), jnp.float32),
    plgpu.SMEM((W, bq), jnp.int32),
    plgpu.SMEM((W, bq), jnp.float32),  # q positions, q segment ids, lse
    smem((2, bk, D)),
    smem((2, bk, D)),  # k, v a slot (rotated in place)
    rotation.table_rows(plan, (2, bk), tabled),
    plgpu.SMEM((2, bk), jnp.int32),  # kv positions (or their tables), segment ids
    plgpu.Barrier(num_barriers=2),  # constants, swap
    plgpu.Barrier(num_barriers=3 * W),  # a warpgroup's q, positions, segments
    plgpu.Barrier(num_barriers=2 * 4),  # a slot's k, v, positions, segments
    plgpu.Barrier(num_arrivals=W),  # a block's rotated shares are all in shared memory
    plgpu.Barrier(num_arrivals=W, num_barriers=2),  # a slot consumed (producer only)
    plgpu.Barrier(num_barriers=2),  # a slot turned (a producer that turns: `producer_turns`)
  ]
  args, out_type = tiles.forward_io(plan, small, q_BTHD, k_BSKD, v_BSKD)
  if tabled:  # the kv positions' cos and sin rows in their place
    args[3] = rotation.key_tables(args[3], args[0], plan)
  body = functools.partial(_body, plan, S // bk, H // K)
  threads = W + (1 if plan.producer else 0)
  part = f"fwd_{W}wg" + ("_tma" if plan.producer else "")
  return tiles.run_kernel(
    plan,
    tiles.named(plan, part, body),
    out_type,
    scratch,
    (H, T // (W * bq), B),
    ("heads", "q", "batch"),
    *args,
    num_threads=threads,
    thread_name=THREAD,
  )


def _body(plan: Plan, nk: int, G: int, *refs):
  """One program: W query blocks of one head, each a compute warpgroup's, and (with
  plan.producer) the warpgroup that copies keys and values. refs: as fused_hopper's forward
  body, with this module's scratch."""
  n_in = 9 if plan.segmented else 7
  ins, outs, scr = refs[:n_in], refs[n_in : n_in + 2], refs[n_in + 2 :]
  consts_ref, swap_ref, q_pos_ref, kv_pos_ref = ins[:4]
  q_seg_ref, kv_seg_ref = ins[4:6] if plan.segmented else (None, None)
  _, k_ref, v_ref = tiles.unpacked(plan, *ins[-3:])
  W = plan.compute_wgs
  b, h, qb = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q")
  wg = lax.axis_index(THREAD)
  kh = lax.div(h, jnp.int32(G))
  k_s, v_s, kvpos_s, kvseg_s = scr[6:10]
  kv_bar, consumed_bar, turned_bar = scr[12], scr[14], scr[15]
  turns = producer_turns(plan, k_s.shape[-1])
  # Every compute warpgroup's rows lie in one 128-row block, so all read the same key blocks.
  n_blocks = tiles.last_key_block(plan, qb * (W * plan.bq), nk) + 1

  def fetch(j, slot):
    srcs = (k_ref, v_ref, kv_pos_ref, kv_seg_ref)
    dsts = lambda s: (k_s.at[s], v_s.at[s], kvpos_s.at[s], kvseg_s.at[s])
    tiles.fetch_keys(plan, srcs, dsts, kv_bar, b, kh, j, slot)

  first_fetches = lambda: tiles.first_key_fetches(fetch, nk, n_blocks)

  if not plan.producer:
    # Warpgroup 0 copies; block j + 1 goes into the slot block j - 1 left, once both warpgroups
    # are past block j's barrier (and so done with block j - 1).
    pl.when(wg == 0)(first_fetches)
    refill = lambda j: pl.when((wg == 0) & (j >= 1) & (j + 1 < n_blocks))(
      lambda: fetch(j + 1, lax.rem(j + 1, 2))
    )
    consumed = None
    _compute(plan, G, ins, outs, scr, n_blocks, refill, consumed)
    return

  @pl.when(wg == W)
  def _producer():
    plgpu.set_max_registers(PRODUCER_REGISTERS[turns], action="decrease")
    first_fetches()

    def refill(j, _):  # block j into the slot block j - 2 held, once both are done with it
      slot = lax.rem(j, 2)
      plgpu.barrier_wait(consumed_bar.at[slot])
      fetch(j, slot)

    if turns:
      rot = rotation.of(plan, tiles.Ops(plan.interpret), scr[0], scr[1])

      def turn(j, _):  # block j turned as it lands; then block j + 1 into block j - 1's slot
        slot = lax.rem(j, 2)
        tiles.wait_block(kv_bar, slot, _block_copies(plan))
        for i in range(plan.bk // TURN_ROWS):
          _turn_rows(plan, rot, (k_s, v_s, kvpos_s), slot, pl.ds(i * TURN_ROWS, TURN_ROWS))
        plgpu.commit_smem()
        plgpu.barrier_arrive(turned_bar.at[slot])
        pl.when((j >= 1) & (j + 1 < n_blocks))(lambda: refill(j + 1, None))

      lax.fori_loop(0, n_blocks, turn, None)
    else:
      lax.fori_loop(2, n_blocks, refill, None)

    # The last two consumptions: the interpreter wants every phase of a barrier waited on by
    # each warpgroup that waits on it at all.
    def drain(j, _):
      plgpu.barrier_wait(consumed_bar.at[lax.rem(j, 2)])

    lax.fori_loop(jnp.maximum(n_blocks - 2, 0), n_blocks, drain, None)

  @pl.when(wg < W)
  def _consumers():
    plgpu.set_max_registers(CONSUMER_REGISTERS[turns], action="increase")
    consumed = lambda slot: plgpu.barrier_arrive(consumed_bar.at[slot])
    _compute(plan, G, ins, outs, scr, n_blocks, lambda j: None, consumed)


# Registers a thread (plgpu.set_max_registers) of the producer and of each compute warpgroup,
# without and with the producer's turns (`producer_turns`): 128 x (p + 2 c) is the program's
# 384 x 168; turning takes the producer more (a 32-row part's tiles and tables), its compute
# warpgroups then fewer and no turns.
PRODUCER_REGISTERS = {False: 40, True: 56}
CONSUMER_REGISTERS = {False: 232, True: 224}
TURN_ROWS = 32  # rows the producer turns at a time (16 bytes a thread of each tile and table)


def _block_copies(plan: Plan) -> int:
  """The TMA copies of a key block (`fetch`: k, v, positions or tables, segment ids)."""
  return 4 if plan.segmented else 3


def _turn_rows(plan: Plan, rot, kv, slot, part) -> None:
  """Rows `part` (static: every slice of a swizzled tile static) of the key and (RoVE) value
  block in `slot` turned in place, at their positions or by their tables. kv: the k, v and
  positions (or tables) buffers, two slots each."""
  k_s, v_s, kvpos_s = kv
  turned = [k_s.at[slot, part]] + ([v_s.at[slot, part]] if plan.rotate_values else [])
  rot.to([(x, x) for x in turned], kvpos_s.at[slot, part])


def producer_turns(plan: Plan, D: int) -> bool:
  """Whether the producer warpgroup also turns each key (and value) block as it lands, before
  the compute warpgroups see it (a "turned" barrier a slot), which then only compute: with
  `producer`, bf16 turns and copied tables (rotation.tables_copied), whose 16-byte loads take
  32-row parts. The turns then overlap the compute warpgroups' products rather than delay
  them; the SM issues as many instructions."""
  return plan.producer and plan.bf16_turns and rotation.tables_copied(plan, D)


def _compute(plan: Plan, G: int, ins, outs, scr, n_blocks, refill, consumed):
  """A compute warpgroup's part: its q block against every key block, sharing the rotation
  of each; refill(j) after block j's barrier, consumed(slot) after its products (or None)."""
  wg = lax.axis_index(THREAD)
  consts_ref, swap_ref = ins[:2]
  q_pos_ref, q_seg_ref = ins[2], ins[4] if plan.segmented else None
  q_ref = tiles.unpacked(plan, *ins[-3:])[0]
  o_ref, lse_ref = outs
  (consts_s, swap_s, q_s, qpos_s, qseg_s, lse_s, k_s, v_s, kvpos_s, kvseg_s) = scr[:10]
  fixed_bar, own_bar, kv_bar, rotated_bar = scr[10:14]
  ops = tiles.Ops(plan.interpret)
  W, bq, bk = plan.compute_wgs, plan.bq, plan.bk
  share = bk // W  # rows of each key block this warpgroup rotates
  b, h, qb = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q")
  q_start = qb * (W * bq) + wg * bq
  rows = pl.ds(q_start, bq)
  n_kv_bar = _block_copies(plan)
  q_own, qpos_own, lse_own = q_s.at[wg], qpos_s.at[wg], lse_s.at[wg]

  constants = rotation.constant_copies(plan, (consts_ref, consts_s), (swap_ref, swap_s))
  n_fixed = tiles.copy_from_first(wg, constants, fixed_bar)

  copies = [(q_ref.at[b, rows, h], q_own), (q_pos_ref.at[b, rows], qpos_own)]
  if plan.segmented:
    copies.append((q_seg_ref.at[b, rows], qseg_s.at[wg]))
  for n, (src, dst) in enumerate(copies):
    plgpu.copy_gmem_to_smem(src, dst, own_bar.at[wg * 3 + n])
  for n in range(n_fixed):
    plgpu.barrier_wait(fixed_bar.at[n])
  for n in range(len(copies)):
    plgpu.barrier_wait(own_bar.at[wg * 3 + n])

  rot = rotation.of(plan, ops, consts_s, swap_s)
  rot.to([(q_own, q_own)], qpos_own, scale_first=True)  # in place
  plgpu.commit_smem()
  q_seg = ops.load(qseg_s.at[wg], 1) if plan.segmented else None

  def rotate_share(slot, i):  # warpgroup i's rows of the block in `slot`
    _turn_rows(plan, rot, (k_s, v_s, kvpos_s), slot, pl.ds(i * share, share))

  turned_bar = scr[15]
  by_producer = producer_turns(plan, k_s.shape[-1])

  def step(j, carry, masked=True):
    slot = lax.rem(j, 2)
    if by_producer:
      plgpu.barrier_wait(turned_bar.at[slot])
    else:
      tiles.wait_block(kv_bar, slot, n_kv_bar)
      for i in range(W):
        pl.when(wg == i)(functools.partial(rotate_share, slot, i))
      plgpu.commit_smem()
      plgpu.barrier_arrive(rotated_bar)
      plgpu.barrier_wait(rotated_bar)
    refill(j)
    kv_seg = ops.load(kvseg_s.at[slot], 0) if plan.segmented else None
    s = ops.mma(q_own, k_s.at[slot], transpose_b=True)  # [bq, bk]
    mask = (
      tiles.visible(ops, plan, q_start, j * bk, q_seg, kv_seg, s.shape, keys_in_rows=False)
      if masked
      else None
    )
    carry = tiles.softmax_step(ops, carry, s, mask, v_s.at[slot])
    if consumed is not None:
      consumed(slot)
    return carry

  start = tiles.softmax_start(ops, bq, q_own.shape[1])
  # Both warpgroups' rows lie in one 128-row block (bk = W * bq), so both run the same blocks
  # without a mask and meet at every block's barrier the same number of times.
  o, lse = tiles.softmax_end(tiles.key_block_loop(plan, q_start, n_blocks, step, start))
  if plan.rotate_output:  # q's tile as the staging and the destination
    rot.f32(o, qpos_own, q_own, q_own, inverse=True)
  else:
    q_own[...] = o.astype(q_own.dtype)
  lse_own[...] = lse
  tiles.store((q_own, o_ref.at[b, rows, h]), (lse_own, lse_ref.at[b, h, rows]))
