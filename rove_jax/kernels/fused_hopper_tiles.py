"""What the Hopper fused kernel's forward (rove_jax.kernels.fused_hopper) and backward
(rove_jax.kernels.fused_hopper_backward) bodies share: matrix products on the tensor cores
(wgmma), the rotation of a tile, its tables from positions, the mask of a block pair, and the
few places where Pallas Mosaic GPU's interpret mode needs another spelling of the same math.

Shape letters: n rows of a tile (bq queries or bk keys), D head dim.

The rotation of a tile (fused_gpu_tiles' formula): with C = cos(pos * f) and S = -sin(pos * f)
on the first member of each pair, +sin(pos * f) on the second (0 on pass-through dims),

    R x = x * C + swap(x) * S,   R^-1 x = x * C - swap(x) * S,

where swap(x)[d] = x[partner of d] is x @ W with W the [D, D] 0/1 pair-swap matrix
(fused_gpu_tiles.swap_matrix), one wgmma with the tile in shared memory as its left operand: a
warpgroup's registers hold a tile in the WGMMA layout, where a dim's pair partner may sit in
another thread, and neither layout ("interleaved", "half") nor partial rotary then needs its own
code. The product is exact for a bfloat16 tile. A float32 tile (an accumulator: the output, dq,
dk, dv) is swapped as two bfloat16 pieces, hi + lo, 16 of its 24 mantissa bits: its error is
below the bfloat16 rounding of the result it feeds.

Interpret mode (Pallas Mosaic GPU's interpreter, jax 0.10): it runs wgmma only with both
operands in shared memory, untransposed, into a fresh accumulator (no register operand, no
transposed operand, no run_state), and it has no rules for layout casts. `Ops(interpret=True)`
therefore runs the products as jnp dots of the same operands in float32 and drops layout hints
(layouts change where values live, not what they are); everything else (TMA copies, barriers,
shared-memory buffers, the loops and masks) runs as compiled.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_tiles, trig
from rove_jax.kernels.fused_tiles import Plan

F32 = jnp.float32
# A 128-byte swizzle with (8, 64)-element tiles: the layout wgmma reads bfloat16 operands in when
# a row is 64 elements or a multiple of them (the head dims taken: 64, 128).
TRANSFORMS = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


class Ops(NamedTuple):
  """The kernel's products and layouts, compiled (wgmma) or interpreted (module docstring)."""

  interpret: bool

  def mma(self, a, b_ref, *, transpose_b: bool = False, acc=None):
    """a @ b (a @ b^T when transpose_b) in float32, added to acc when given. a: a shared-memory
    ref or a register array (bfloat16), b_ref: a shared-memory ref."""
    if self.interpret:
      a_val = a[...] if _is_ref(a) else a
      b_val = b_ref[...]
      dims = (((1,), (1,)) if transpose_b else ((1,), (0,)), ((), ()))
      out = lax.dot_general(a_val, b_val, dims, preferred_element_type=F32)
      return out if acc is None else acc + out
    b = plgpu.transpose_ref(b_ref, (1, 0)) if transpose_b else b_ref
    if acc is None:

      def fresh(acc_ref):
        plgpu.wgmma(acc_ref, a, b)
        return acc_ref[...]

      return pl.run_scoped(fresh, plgpu.ACC((a.shape[0], b.shape[1]), F32))

    def into(acc_ref):
      plgpu.wgmma(acc_ref, a, b)

    return pl.run_state(into)(plgpu.ACC.init(acc))

  def wgmma_layout(self, x):
    """x with the layout of a wgmma accumulator (a hint; the identity when interpreting)."""
    return x if self.interpret else plgpu.layout_cast(x, plgpu.Layout.WGMMA)

  def rows_layout(self, x):
    """A vector of one value per tile row, laid out for broadcasting along rows."""
    return x if self.interpret else plgpu.layout_cast(x, plgpu.Layout.WGMMA.reduce(1))

  def load(self, ref, along: int = 1):
    """A shared-memory ref's value: a 1-D ref as a vector to broadcast along dim `along` of a
    tile (1: one value per row, 0: one per column), a 2-D one as a tile."""
    if self.interpret:
      return ref[...]
    layout = plgpu.Layout.WGMMA if len(ref.shape) == 2 else plgpu.Layout.WGMMA.reduce(along)
    return plgpu.load(ref, (), layout=layout)

  def iota(self, shape, dim: int):
    if self.interpret:
      return lax.broadcasted_iota(jnp.int32, shape, dim)
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def _is_ref(x) -> bool:
  return hasattr(x, "transforms") or isinstance(jax.typeof(x), jax.ref.AbstractRef)


def across(v, shape, along: int):
  """A vector broadcast into a tile: one value per row (along=1) or per column (along=0)."""
  return lax.broadcast_in_dim(v, shape, [1 - along])


# The columns a rotation takes at once: a [64, D] tile's tables, products and result in float32
# take 4 * D registers a thread; at D = 128 that is all a thread has.
COLS = 64


def pieces(D: int):
  """The column pieces (start, size) of a rotation of a [n, D] tile; None: the whole tile."""
  return [None] if D <= COLS else [(c, COLS) for c in range(0, D, COLS)]


def _cols(x, piece):
  """A column piece of a shared-memory ref or a register tile (the whole of it for None)."""
  if piece is None:
    return x
  start, size = piece
  return x.at[:, pl.ds(start, size)] if _is_ref(x) else x[:, start : start + size]


def _row(consts_ref, row: int, piece):
  return consts_ref.at[row] if piece is None else consts_ref.at[row, pl.ds(*piece)]


def tables(ops: Ops, pos_ref, consts_ref, piece=None):
  """(C, S), each [n, D] float32 (or [n, size] for a column piece), for the n positions in a
  shared-memory ref [n] float32: C = cos(pos * f), S = sin(pos * f) signed per dim (module
  docstring)."""
  pos = ops.load(pos_ref, 1)
  freq = ops.load(_row(consts_ref, fused_tiles.FREQ, piece), 0)
  sign = ops.load(_row(consts_ref, fused_tiles.NEG_FIRST, piece), 0) + ops.load(
    _row(consts_ref, fused_tiles.SECOND, piece), 0
  )
  shape = (pos.shape[0], freq.shape[0])
  angle = across(pos, shape, 1) * across(freq, shape, 0)
  sin, cos = trig.sincos(angle)  # not jnp.sin, jnp.cos: rove_jax.kernels.trig
  return cos, sin * across(sign, shape, 0)


def query_scale(ops: Ops, consts_ref, shape, piece=None):
  """[n, D] (or the piece's columns): the softmax scale times the attention factor squared on
  the rotated dims."""
  return across(ops.load(_row(consts_ref, fused_tiles.Q_SCALE, piece), 0), shape, 0)


def rotate(ops: Ops, x_ref, tabs, swap_ref, *, inverse: bool = False, piece=None):
  """R x (R^-1 x when inverse) in float32 of a bfloat16 tile in shared memory [n, D], or of
  the column piece that tabs were taken for (its products read all of x)."""
  c, s = tabs
  turned = ops.mma(x_ref, _cols(swap_ref, piece)) * s
  x = ops.load(_cols(x_ref, piece)).astype(F32)
  return x * c - turned if inverse else x * c + turned


def rotate_to(ops: Ops, pairs, pos_ref, consts_ref, swap_ref, *, scaled: bool = False):
  """dst = R src for each (src, dst) pair of bfloat16 shared-memory tiles [n, D] at the
  positions in pos_ref, a column piece at a time, its tables shared by the pairs; times the
  query scale when scaled. A dst must not be its src: a piece's product reads all of src."""
  for piece in pieces(pairs[0][0].shape[1]):
    tabs = tables(ops, pos_ref, consts_ref, piece)
    for src, dst in pairs:
      x = rotate(ops, src, tabs, swap_ref, piece=piece)
      if scaled:
        x = x * query_scale(ops, consts_ref, x.shape, piece)
      _cols(dst, piece)[...] = x.astype(dst.dtype)


def rotate_f32(ops: Ops, y, pos_ref, consts_ref, swap_ref, stage_ref, dst_ref, *, inverse=False):
  """dst = R y (R^-1 y) in dst's dtype, of a float32 register tile [n, D] at the positions in
  pos_ref, a column piece at a time; the pair swap is taken as two bfloat16 pieces (module
  docstring) staged in stage_ref: [2, n, D] holds both side by side; one [n, D] tile takes
  them in turn (less shared memory, one more store and wait), and may then be dst."""
  hi = y.astype(jnp.bfloat16)
  lo = (y - hi.astype(F32)).astype(jnp.bfloat16)
  parts = pieces(y.shape[1])
  swap = lambda piece: _cols(swap_ref, piece)
  if len(stage_ref.shape) == 3:
    stage_ref.at[0][...] = hi
    stage_ref.at[1][...] = lo
    plgpu.commit_smem()
    turn = lambda i, piece: ops.mma(
      stage_ref.at[1], swap(piece), acc=ops.mma(stage_ref.at[0], swap(piece))
    )
  else:  # every product is taken before dst, which may be the stage, is written
    stage_ref[...] = hi
    plgpu.commit_smem()
    turned = [ops.mma(stage_ref, swap(piece)) for piece in parts]
    stage_ref[...] = lo
    plgpu.commit_smem()
    turned = [ops.mma(stage_ref, swap(piece), acc=t) for piece, t in zip(parts, turned)]
    turn = lambda i, piece: turned[i]
  for i, piece in enumerate(parts):
    c, s = tables(ops, pos_ref, consts_ref, piece)
    t = turn(i, piece) * s
    y_piece = _cols(y, piece)
    _cols(dst_ref, piece)[...] = (y_piece * c - t if inverse else y_piece * c + t).astype(
      dst_ref.dtype
    )


def store(*copies) -> None:
  """Copies each (shared-memory tile, HBM destination) pair out, after the stores before it
  are committed, and waits until all are written."""
  plgpu.commit_smem()
  for src, dst in copies:
    plgpu.copy_smem_to_gmem(src, dst)
  plgpu.wait_smem_to_gmem(0)


def visible(ops: Ops, plan, q_start, k_start, q_seg, kv_seg, shape, *, keys_in_rows: bool):
  """The bool mask [rows, cols] of a block pair, or None when all of it is visible: causal by
  index (the Mask's `ordered` promise), same segment. q_start, k_start: the pair's first query
  and key index; q_seg, kv_seg: segment-id vectors (None without segments)."""
  q_axis, k_axis = (1, 0) if keys_in_rows else (0, 1)
  mask = None
  if plan.causal:
    mask = (k_start + ops.iota(shape, k_axis)) <= (q_start + ops.iota(shape, q_axis))
  if plan.segmented:
    same = across(q_seg, shape, 1 - q_axis) == across(kv_seg, shape, 1 - k_axis)
    mask = same if mask is None else jnp.logical_and(mask, same)
  return mask


def forward_io(plan, small, q_BTHD, k_BSKD, v_BSKD):
  """(the forward kernels' inputs in their refs' order: constants, swap matrix, q and kv
  positions, q and kv segment ids when segmented, q, k, v; the types of their outputs: o like
  q, lse [B, H, T] float32). small: the kernel's (constants, swap, positions, segments)."""
  consts, swap, q_pos, kv_pos, q_seg, kv_seg = small
  args = [consts, swap, q_pos, kv_pos]
  if plan.segmented:
    args += [q_seg, kv_seg]
  B, T, H, _ = q_BTHD.shape
  out_type = [
    jax.ShapeDtypeStruct(q_BTHD.shape, q_BTHD.dtype),
    jax.ShapeDtypeStruct((B, H, T), F32),
  ]
  return args + [q_BTHD, k_BSKD, v_BSKD], out_type


def fetch_keys(plan, srcs, bufs, bar, b, kh, j, slot) -> None:
  """Issues the TMA copies of key block j of example b, kv head kh (k, v, positions and, when
  segmented, segment ids) into `slot` of their double buffers, each on its own barrier:
  bar.at[slot * n + i] for the i-th of the n copies. srcs: (k, v, kv positions, kv segment ids
  or None) in HBM; bufs: their [2, ...] shared-memory buffers in the same order."""
  keys = pl.ds(j * plan.bk, plan.bk)
  k_ref, v_ref, pos_ref, seg_ref = srcs
  k_s, v_s, pos_s, seg_s = bufs
  pairs = [
    (k_ref.at[b, keys, kh], k_s.at[slot]),
    (v_ref.at[b, keys, kh], v_s.at[slot]),
    (pos_ref.at[b, keys], pos_s.at[slot]),
  ]
  if plan.segmented:
    pairs.append((seg_ref.at[b, keys], seg_s.at[slot]))
  for i, (src, dst) in enumerate(pairs):
    plgpu.copy_gmem_to_smem(src, dst, bar.at[slot * len(pairs) + i])


def softmax_start(ops: Ops, bq: int, D: int):
  """The online softmax's carry before the first key block: (accumulator [bq, D], running max
  [bq], running sum [bq]), float32."""
  return (
    ops.wgmma_layout(jnp.zeros((bq, D), F32)),
    ops.rows_layout(jnp.full((bq,), -jnp.inf, F32)),
    ops.rows_layout(jnp.zeros((bq,), F32)),
  )


def softmax_step(ops: Ops, carry, s, mask, values_ref):
  """One key block of the online softmax: the scores s [bq, bk] masked (mask: `visible`'s, or
  None), the carry rescaled to the new running max, and p . values (values_ref [bk, D] in shared
  memory, p in its dtype) added to the accumulator. A row with nothing visible yet keeps max
  -inf, sum 0."""
  acc, m_prev, l_prev = carry
  if mask is not None:
    s = jnp.where(mask, s, -jnp.inf)
  m_next = jnp.maximum(m_prev, s.max(axis=1))
  m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
  p = jnp.exp(s - across(m_safe, s.shape, 1))
  alpha = jnp.exp(m_prev - m_safe)
  l_next = alpha * l_prev + p.sum(axis=1)
  acc = ops.mma(p.astype(values_ref.dtype), values_ref, acc=across(alpha, acc.shape, 1) * acc)
  return acc, m_next, l_next


def softmax_end(carry):
  """(o [bq, D] float32, logsumexp [bq]) of the last carry; rows that saw no key: o 0, lse
  +inf."""
  acc, m, l = carry
  seen = l > 0.0
  safe_l = jnp.where(seen, l, 1.0)
  return acc / across(safe_l, acc.shape, 1), jnp.where(seen, m + jnp.log(safe_l), jnp.inf)


def interpret_params():
  """The `interpret` value that runs a Mosaic GPU kernel on CPU. jax 0.10 exports the class
  only from its private tree."""
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  return InterpretGPUParams()


def named(plan: Plan, part: str, body):
  """body under the kernel name rotary_flash_<part>_<rove or rope> (part: fwd, fwd_2wg, dq,
  dkv), the name profiler traces and Mosaic GPU's dumps show (a functools.partial has none)."""

  def kernel(*refs):
    return body(*refs)

  kernel.__name__ = f"rotary_flash_{part}_{'rove' if plan.rotate_values else 'rope'}"
  return kernel


def run_kernel(plan: Plan, body, out_type, scratch, grid, grid_names, *args, **threads):
  """plgpu.kernel(body), compiled or interpreted by plan; one warpgroup a program unless
  threads gives num_threads and thread_name."""
  return plgpu.kernel(
    body,
    **threads,
    out_type=out_type,
    scratch_types=scratch,
    grid=grid,
    grid_names=grid_names,
    interpret=interpret_params() if plan.interpret else None,
    compiler_params=plgpu.CompilerParams(approx_math=False),
  )(*args)


def last_key_block(plan: Plan, q_start, n_kv_blocks: int):
  """The last key block a query block starting at q_start reads (all without causality)."""
  if not plan.causal:
    return n_kv_blocks - 1
  return jnp.minimum(lax.div(q_start + plan.bq - 1, plan.bk), n_kv_blocks - 1)
