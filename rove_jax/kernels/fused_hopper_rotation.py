"""The rotation of tiles in the Hopper fused kernels (rove_jax.kernels.fused_hopper, its
backward pass and fused_hopper_ws): `Rotation` turns bfloat16 tiles in shared memory and float32
tiles in registers by R or R^-1 at their positions, in one of two ways.

The swap matrix (any layout, any partial rotary). With C = cos(pos * f) and S = -sin(pos * f) on
the first member of each pair, +sin(pos * f) on the second (0 on pass-through dims),

    R x = x * C + swap(x) * S,   R^-1 x = x * C - swap(x) * S,

where swap(x)[d] = x[partner of d] is x @ W with W the [D, D] 0/1 pair-swap matrix
(fused_gpu_tiles.swap_matrix), one wgmma with the tile in shared memory as its left operand: a
warpgroup's registers hold a tile in the WGMMA layout, where a dim's pair partner may sit in
another thread. The product is exact for a bfloat16 tile. A float32 tile (an accumulator: the
output, dq, dk, dv) is swapped as two bfloat16 pieces, hi + lo, 16 of its 24 mantissa bits: its
error is below the bfloat16 rounding of the result it feeds.

Column slices (plan.slice_swap: the half layout, r = n_rotated / 2 a multiple of 16). Pair i is
dims i and i + r, so the swapped tile is the tile's column slices [0, r) and [r, 2r) exchanged:
loaded from shared memory or sliced out of registers, with no swap matrix, no wgmma, no bfloat16
split, and cos and sin taken once a pair instead of once a dim. A column slice of a swizzled
tile must start and end on a tile, so the kernel's tiles then take the swizzle `transforms`
picks. Mosaic GPU has no register concatenation, no strided slices and no bfloat16-pair bitcast,
so the interleaved layout (partner d ^ 1, in the same thread's register pair) keeps the matrix.

With plan.bf16_turns, `to` turns its bfloat16 tiles by slices in bfloat16 pairs: the tiles'
values as they are, the piece's tables rounded to bfloat16 once and shared by its tiles (q's
multiplied by its scale first, which a pair's members share), two values an instruction
(mul.bf16x2, fma.rn.bf16x2), as transformers turns bfloat16 q and k. It skips widening each
value to float32 and packing it back, and halves the products. The price is about one more
bfloat16 rounding an element (of b s and of the tables); the float32 accumulators (`f32`)
stay in float32. Interpreted, those roundings are spelled out (`_turn_bf16`), so that the tests
on CPU see the GPU's. Where tiles and tables all come from shared memory they load 16 bytes a
thread (Ops.load's swizzle: `Rotation.flat`). bench/RESULTS.md has the instructions and the error
against float32 math.

Either way a rotation runs a column piece at a time, its tables shared by the tiles it turns:
a [64, 64] tile's tables, products and result in float32 take most of a thread's registers
(python -m bench.fused_gpu --aot h200 --ptxas reports each kernel's registers and spills). sin
and cos are rove_jax.kernels.trig's range reduction by whole turns (trig.turns: three fused
multiply-adds) followed by the GPU's sin.approx and cos.approx (sincos(hardware=True), under the
kernels' approximate math), not libdevice's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels import fused_tiles, trig
from rove_jax.kernels.fused_tiles import Plan

F32 = jnp.float32
COLS = 64  # the columns of a piece rotated by the swap matrix
SLICE_COLS = (32, 16)  # a slice piece's columns: the swizzle's column tiles (64-, 32-byte)


def slice_problem(rope) -> Optional[str]:
  """None when column slices can rotate this rotary.Rope's pairs; else the reason."""
  if rope.layout != "half" or rope.n_rotated // 2 % SLICE_COLS[-1]:
    return (
      f"slice_swap needs the half layout with n_rotated / 2 a multiple of {SLICE_COLS[-1]}, "
      f"got layout={rope.layout!r}, n_rotated={rope.n_rotated}"
    )
  return None


def transforms(plan: Plan):
  """The tiling and swizzle of the bfloat16 tiles a kernel rotates: tiles.TRANSFORMS, or with
  plan.slice_swap the one whose column tiles are a slice piece's columns."""
  if not plan.slice_swap:
    return tiles.TRANSFORMS
  cols = _slice_cols(plan.pair_offset)
  return (plgpu.TilingTransform((8, cols)), plgpu.SwizzleTransform(2 * cols))


def in_place(plan: Plan, D: int) -> bool:
  """Whether Rotation.to turns a [n, D] tile in place still a column piece at a time: by
  slices, with one piece (D <= 64), or where every pair lies within a piece (`Rotation._local`).
  Elsewhere in place takes the whole tile at once (its tables and products in registers)."""
  return plan.slice_swap or D <= COLS or _pairs_local(plan.pair_offset)


def swap_scratch(plan: Plan, D: int, smem):
  """The swap matrix's shared memory: smem((D, D)), or a placeholder with plan.slice_swap (it
  keeps the kernels' scratch unpacking)."""
  return tiles.placeholder() if plan.slice_swap else smem((D, D))


def constant_copies(plan: Plan, consts, swap) -> list:
  """The (source, shared-memory destination) pairs every kernel copies first: the constants
  and, unless pairs are swapped by column slices, the swap matrix."""
  return [consts] + ([] if plan.slice_swap else [swap])


def of(plan: Plan, ops, consts_ref, swap_ref) -> "Rotation":
  """The Rotation of a kernel body under plan (by column slices with plan.slice_swap)."""
  swap = None if plan.slice_swap else swap_ref
  return Rotation(ops, consts_ref, swap, plan.pair_offset, plan.slice_swap and plan.bf16_turns)


def _slice_cols(r: int) -> int:
  return next(c for c in SLICE_COLS if r % c == 0)


def _cols(x, piece):
  """Columns (start, size) of a shared-memory ref or a register tile; all of it for None."""
  if piece is None:
    return x
  start, size = piece
  return x.at[:, pl.ds(start, size)] if tiles.is_ref(x) else x[:, start : start + size]


def _row(consts_ref, row: int, piece):
  return consts_ref.at[row] if piece is None else consts_ref.at[row, pl.ds(*piece)]


def _angles(ops, pos_ref, consts_ref, piece):
  pos = ops.load(pos_ref, 1)
  freq = ops.load(_row(consts_ref, fused_tiles.FREQ, piece), 0)
  shape = (pos.shape[0], freq.shape[0])
  return tiles.across(pos, shape, 1) * tiles.across(freq, shape, 0)


def tables(ops, pos_ref, consts_ref, piece=None):
  """(C, S) float32 [n, D] (or the piece's columns) for the n positions in a shared-memory ref
  [n] float32: C = cos(pos * f), S = sin(pos * f) signed per dim (module docstring)."""
  sin, cos = trig.sincos(_angles(ops, pos_ref, consts_ref, piece), hardware=True)
  sign = ops.load(_row(consts_ref, fused_tiles.NEG_FIRST, piece), 0) + ops.load(
    _row(consts_ref, fused_tiles.SECOND, piece), 0
  )
  return cos, sin * tiles.across(sign, sin.shape, 0)


def query_scale(ops, consts_ref, shape, piece=None):
  """[n, D] (or the piece's columns): the softmax scale times the attention factor squared on
  the rotated dims."""
  return tiles.across(ops.load(_row(consts_ref, fused_tiles.Q_SCALE, piece), 0), shape, 0)


def _turn(a, b, tabs, inverse: bool):
  """R on pair members a (first) and b (second): (a c - b s, b c + a s); R^-1 with -s."""
  c, s = tabs
  s = -s if inverse else s
  return a * c - b * s, b * c + a * s


def _turn_bf16(a, b, tabs, interpret: bool):
  """R on bfloat16 pair members a, b by bfloat16 tables (c, s): (a c - b s, b c + a s), as the
  GPU computes it, a product (mul.bf16x2) and a fused multiply-add (fma.rn.bf16x2) a member,
  each rounding once to bfloat16. Interpreted, the roundings are spelled out (float32 math, which
  holds a bfloat16 product exactly, then lax.reduce_precision to bfloat16): XLA on CPU may
  otherwise keep float32 between bfloat16 operations and round less than the GPU does."""
  c, s = tabs
  if not interpret:
    return a * c - b * s, b * c + a * s
  a, b, c, s = (x.astype(F32) for x in (a, b, c, s))
  rnd = lambda x: lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)
  first = rnd(a * c - rnd(b * s))
  second = rnd(b * c + rnd(a * s))
  return first.astype(jnp.bfloat16), second.astype(jnp.bfloat16)


class Rotation(NamedTuple):
  """The rotations of one kernel body: its ops, constants [CONST_ROWS, D] and swap matrix in
  shared memory (None: by column slices), and the pair offset (plan.pair_offset)."""

  ops: Any
  consts_ref: Any
  swap_ref: Any
  r: int
  bf16: bool = False  # `to` turns unscaled tiles by slices in bfloat16 pairs (module docstring)

  def to(self, pairs, pos_ref, *, scale_first: bool = False) -> None:
    """dst = R src for each (src, dst) pair of bfloat16 tiles [n, D] in shared memory at the
    positions in pos_ref; the first pair's also times the query scale when scale_first (q's,
    with dO's beside it in the backward pass). A dst may be its src (in place). pos_ref is
    the rows' positions [n] float32 in shared memory or, with slices, their cos and sin
    [n, 2 r] (`key_tables`, `table_rows`), which the rotation then loads rather than
    computes. Query tables in bfloat16 are `key_tables(scaled=True)`: q's scaled, then
    (RoVE) dO's; any tile not scaled takes a table's last 2 r columns."""
    if self.swap_ref is None:
      return self._slices(pairs, pos_ref, scale_first)
    assert len(pos_ref.shape) == 1, "tables from memory are for the slice rotation"
    D = pairs[0][0].shape[1]
    # In place, a piece whose product reads other pieces' columns would read what an earlier
    # piece wrote: then the tile is one piece.
    in_place = any(s is d for s, d in pairs)
    parts = [None] if in_place and not self._local() else _pieces(D)
    for piece in parts:
      tabs = tables(self.ops, pos_ref, self.consts_ref, piece)
      for i, (src, dst) in enumerate(pairs):
        x = self._matrix(src, tabs, piece, inverse=False)
        if scale_first and i == 0:
          x = x * query_scale(self.ops, self.consts_ref, x.shape, piece)
        _cols(dst, piece)[...] = x.astype(dst.dtype)

  def f32(self, y, pos_ref, stage_ref, dst_ref, *, inverse: bool = False) -> None:
    """dst = R y (R^-1 y when inverse) in dst's dtype, of a float32 register tile [n, D] at the
    positions in pos_ref. The swap matrix's bfloat16 pieces are staged in stage_ref: [2, n, D]
    holds both side by side; one [n, D] tile takes them in turn and may be dst."""
    if self.swap_ref is None:
      return self._slices_f32(y, pos_ref, dst_ref, inverse)
    ops, swapped = self.ops, self._swapped
    hi = y.astype(jnp.bfloat16)
    lo = (y - hi.astype(F32)).astype(jnp.bfloat16)
    parts = _pieces(y.shape[1])
    if len(stage_ref.shape) == 3:
      stage_ref.at[0][...] = hi
      stage_ref.at[1][...] = lo
      plgpu.commit_smem()
      turn = lambda i, p: swapped(stage_ref.at[1], p, acc=swapped(stage_ref.at[0], p))
    else:  # every product is taken before dst, which may be the stage, is written
      stage_ref[...] = hi
      plgpu.commit_smem()
      turned = [swapped(stage_ref, p) for p in parts]
      stage_ref[...] = lo
      plgpu.commit_smem()
      turned = [swapped(stage_ref, p, acc=t) for p, t in zip(parts, turned)]
      turn = lambda i, p: turned[i]
    for i, piece in enumerate(parts):
      c, s = tables(ops, pos_ref, self.consts_ref, piece)
      t, y_piece = turn(i, piece) * s, _cols(y, piece)
      out = y_piece * c - t if inverse else y_piece * c + t
      _cols(dst_ref, piece)[...] = out.astype(dst_ref.dtype)

  def flat(self, pos_ref) -> bool:
    """Whether `to` turns tiles at pos_ref in bfloat16 pairs loaded 16 bytes a thread (Ops.load's
    swizzle): bf16 turns (by slices) with tables from memory. Any number of rows a multiple of 8
    then turns, where the WGMMA layout needs 64."""
    return self.bf16 and len(pos_ref.shape) == 2

  def _local(self) -> bool:
    """Whether both members of every pair lie in one swap-matrix piece: the interleaved layout
    (pairs 2i, 2i + 1), or the half layout with all rotated dims in the first piece."""
    return _pairs_local(self.r)

  def _swapped(self, x_ref, piece, acc=None):
    """swap(x) of a bfloat16 tile in shared memory [n, D], or its column piece: the piece's
    columns of x times the piece's block of the swap matrix where pairs stay within pieces
    (`_local`), all of x times the piece's columns of the matrix otherwise."""
    if piece is None:
      return self.ops.mma(x_ref, self.swap_ref, acc=acc)
    if self._local():
      block = self.swap_ref.at[pl.ds(*piece), pl.ds(*piece)]
      return self.ops.mma(_cols(x_ref, piece), block, acc=acc)
    return self.ops.mma(x_ref, _cols(self.swap_ref, piece), acc=acc)

  def _matrix(self, x_ref, tabs, piece, *, inverse: bool):
    """R x (R^-1 x) in float32 of a bfloat16 tile in shared memory, or of the column piece
    tabs were taken for."""
    c, s = tabs
    turned = self._swapped(x_ref, piece) * s
    x = self.ops.load(_cols(x_ref, piece)).astype(F32)
    return x * c - turned if inverse else x * c + turned

  def _slice_pieces(self):
    """Pairs a piece at a time: ((start, size) of first members, (start, size) of seconds)."""
    r, n = self.r, _slice_cols(self.r)
    return [((i, n), (self.r + i, n)) for i in range(0, r, n)]

  def _half_tables(self, pos_ref, piece, after: int = 0, swizzle=None):
    """(cos, sin) [n, piece's columns] of the pairs whose first members are the piece's, from
    the positions [n] or loaded from their tables [n, 2 r] (`to`), those `after` columns in
    (in the layout of swizzled copies given the swizzle: Ops.load)."""
    if len(pos_ref.shape) == 2:
      start, size = piece
      at = (after + start, after + self.r + start)
      return tuple(self.ops.load(pos_ref.at[:, pl.ds(a, size)], swizzle=swizzle) for a in at)
    sin, cos = trig.sincos(_angles(self.ops, pos_ref, self.consts_ref, piece), hardware=True)
    return cos, sin

  def _slices(self, pairs, pos_ref, scale_first: bool) -> None:
    ops, consts = self.ops, self.consts_ref
    # Tables from memory in bfloat16 with scale_first: the first pair's scaled, and the
    # unscaled ones (if any) in the last 2 r columns, as in every table from memory (`to`).
    from_memory = len(pos_ref.shape) == 2
    prescaled = self.bf16 and scale_first and from_memory
    unscaled_at = pos_ref.shape[1] - 2 * self.r if from_memory else 0
    # bfloat16 tiles and tables all from shared memory, all with one swizzle (a piece's
    # columns, 2 bytes each): loaded in the layout of swizzled copies (Ops.load).
    swizzle = 2 * _slice_cols(self.r) if self.flat(pos_ref) else None
    for first, second in self._slice_pieces():
      tabs = self._half_tables(pos_ref, first, swizzle=swizzle)
      narrow = None  # the piece's bfloat16 tables, rounded once and shared by its tiles
      for i, (src, dst) in enumerate(pairs):
        scaled = scale_first and i == 0
        a, b = (ops.load(_cols(src, p), swizzle=swizzle) for p in (first, second))
        if self.bf16:  # a pair's members share its scale: the scaled tables turn them
          if scaled and prescaled:
            t = tabs
          elif scaled:
            scale = query_scale(ops, consts, tabs[0].shape, first)
            t = tuple((x.astype(F32) * scale).astype(jnp.bfloat16) for x in tabs)
          else:
            if narrow is None:
              own = tabs
              if unscaled_at:
                own = self._half_tables(pos_ref, first, unscaled_at, swizzle)
              narrow = tuple(x.astype(jnp.bfloat16) for x in own)
            t = narrow
          for p, x in zip((first, second), _turn_bf16(a, b, t, ops.interpret)):
            _cols(dst, p)[...] = x.astype(dst.dtype)
          continue
        new = _turn(a.astype(F32), b.astype(F32), tabs, inverse=False)
        for p, x in zip((first, second), new):
          if scaled:
            x = x * query_scale(ops, consts, x.shape, p)
          _cols(dst, p)[...] = x.astype(dst.dtype)
    D = pairs[0][0].shape[1]
    rest = (2 * self.r, D - 2 * self.r)
    for i, (src, dst) in enumerate(pairs):
      scaled = scale_first and i == 0
      if rest[1] and (scaled or src is not dst):  # pass-through dims: copied (and scaled)
        x = ops.load(_cols(src, rest)).astype(F32)
        x = x * query_scale(ops, consts, x.shape, rest) if scaled else x
        _cols(dst, rest)[...] = x.astype(dst.dtype)

  def _slices_f32(self, y, pos_ref, dst_ref, inverse: bool) -> None:
    for first, second in self._slice_pieces():
      tabs = self._half_tables(pos_ref, first)
      new = _turn(_cols(y, first), _cols(y, second), tabs, inverse)
      for p, x in zip((first, second), new):
        _cols(dst_ref, p)[...] = x.astype(dst_ref.dtype)
    rest = (2 * self.r, y.shape[1] - 2 * self.r)
    if rest[1]:
      _cols(dst_ref, rest)[...] = _cols(y, rest).astype(dst_ref.dtype)


def tables_copied(plan: Plan, D: int) -> bool:
  """Whether a kernel whose looped blocks' cos and sin may arrive by TMA (`key_tables`, a row of
  `table_width` a position) takes them beside each block, in two slots, rather than computing
  them from the positions in every program that reads the block: with slices (the tables the
  slice rotation reads) at D = 64, where two slots (float32: 64 rows 32 KiB, 128 rows 64 KiB;
  bfloat16 half that) fit beside the rest of the kernel's shared memory. Each rotated row then
  takes two shared-memory loads a piece where its sines and cosines took about ten
  instructions each; the price is those bytes read from L2 with each block, as many as k's and
  v's in float32. The kernels that take them so are those where the shared memory costs no
  programs an SM (their registers bound them): the two-warpgroup forward, dq and dk, dv, and
  the one-warpgroup dk, dv (fused_hopper_backward_io.copies_tables). The one-warpgroup forward
  and dq, whose programs an SM two slots would halve, take bfloat16 tables into one slot
  (`tables_in_one_slot`) or compute them."""
  return plan.slice_swap and D == 64


def tables_in_one_slot(plan: Plan, D: int, *, forward: bool) -> bool:
  """Whether the one-warpgroup forward (forward) or dq, whose programs an SM their shared
  memory bounds, copy their key blocks' tables all the same: in bfloat16 (plan.bf16_turns) by
  slices, into one slot, which keeps their programs an SM (two slots, or float32 tables, would
  not): at D = 64 both (16 KiB for the forward's 128 keys, 8 for dq's 64); at D = 128 the
  forward (16 KiB for 64 keys), not dq, whose second program an SM they would cost. Block
  j + 1's are copied as soon as block j is turned and committed (plgpu.commit_smem: a
  warpgroup barrier, so every warp has read block j's), and the copy overlaps the block's
  products."""
  return plan.bf16_turns and plan.slice_swap and (D == 64 or (D == 128 and forward))


def table_dtype(plan: Plan):
  """The dtype of copied tables (`key_tables`): bfloat16 where the rotation turns in bfloat16
  pairs (plan.bf16_turns: what it would round them to), float32 elsewhere."""
  return jnp.bfloat16 if plan.bf16_turns else F32


def table_width(plan: Plan, scaled: bool = False) -> int:
  """The columns of a row of `key_tables`: 2 r, or 4 r for scaled ones in bfloat16 when the
  output turns too (RoVE's dO beside q)."""
  both = scaled and plan.bf16_turns and plan.rotate_output
  return (4 if both else 2) * plan.pair_offset


def key_tables(pos_BS, consts, plan: Plan, scaled: bool = False):
  """[B, S, `table_width`] (`table_dtype`): cos then sin of pos * f for each of the r pair
  frequencies (the constants' FREQ row's first r entries, the half layout's), a row per
  position: what a kernel copies into shared memory beside a block of keys in place of its
  positions (`Rotation.to`), computed here by XLA (jnp.cos, jnp.sin) in float32 once a call
  rather than in every program that reads the block. scaled: of query blocks, whose q is
  scaled; in bfloat16 they are then cos and sin times q's scale (a pair's, its first member's
  Q_SCALE entry), followed for RoVE by the unscaled ones that turn dO."""
  r = plan.pair_offset
  angle = pos_BS.astype(F32)[:, :, None] * consts[fused_tiles.FREQ, :r][None, None]
  tabs = [jnp.cos(angle), jnp.sin(angle)]
  if scaled and plan.bf16_turns:
    scale = consts[fused_tiles.Q_SCALE, :r][None, None]
    tabs = [t * scale for t in tabs] + (tabs if plan.rotate_output else [])
  out = jnp.concatenate(tabs, axis=-1).astype(table_dtype(plan))
  assert out.shape[-1] == table_width(plan, scaled), out.shape
  return out


def table_rows(plan: Plan, lead, tabled: bool, scaled: bool = False):
  """The shared memory of a block's position rows (float32 `lead`, e.g. (slots, rows)), or with
  tabled of their `key_tables` rows, [*lead, `table_width`] tiled and swizzled as the slice
  rotation loads its column pieces (a piece's row 32 columns: 128 bytes in float32, 64 in
  bfloat16; no bank conflicts)."""
  if not tabled:
    return plgpu.SMEM(lead, F32)
  cols, dtype = _slice_cols(plan.pair_offset), table_dtype(plan)
  swizzle = (
    plgpu.TilingTransform((8, cols)),
    plgpu.SwizzleTransform(jnp.dtype(dtype).itemsize * cols),
  )
  return plgpu.SMEM(tuple(lead) + (table_width(plan, scaled),), dtype, transforms=swizzle)


def _pairs_local(r: int) -> bool:
  """Whether both members of every pair (pair offset r) lie in one COLS-column piece."""
  return r == 1 or 2 * r <= COLS


def _pieces(D: int):
  """The swap matrix's column pieces (start, size) of a [n, D] tile; [None]: the whole."""
  return [None] if D <= COLS else [(c, COLS) for c in range(0, D, COLS)]
