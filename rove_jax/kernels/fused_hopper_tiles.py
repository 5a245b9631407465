"""What the Hopper fused kernel's forward (rove_jax.kernels.fused_hopper) and backward
(rove_jax.kernels.fused_hopper_backward) bodies share: matrix products on the tensor cores
(wgmma), the mask of a block pair, the online softmax, the copies in and out, and the few places
where Pallas Mosaic GPU's interpret mode needs another spelling of the same math. The rotation
of tiles is rove_jax.kernels.fused_hopper_rotation's.

Shape letters: n rows of a tile (bq queries or bk keys), D head dim.

Interpret mode (Pallas Mosaic GPU's interpreter, jax 0.10): it runs wgmma only with both
operands in shared memory, untransposed, into a fresh accumulator (no register operand, no
transposed operand, no run_state), and it has no rules for layout casts. `Ops(interpret=True)`
therefore runs the products as jnp dots of the same operands in float32 and drops layout hints
(layouts change where values live, not what they are); everything else (TMA copies, barriers,
shared-memory buffers, the loops and masks) runs as compiled.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import trig
from rove_jax.kernels.fused_tiles import Plan
from rove_jax.kernels.mgpu_interpret import interpret_params

F32 = jnp.float32
# A 128-byte swizzle with (8, 64)-element tiles: the layout wgmma reads bfloat16 operands in when
# a row is 64 elements or a multiple of them (the head dims taken: 64, 128).
TRANSFORMS = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
# The kernels are written for Mosaic GPU's lane semantics (each thread's share of a tile, with
# the layouts they ask for by hand), which jax 0.10 uses by default; jax 0.11 made warpgroup
# semantics (layouts inferred) the default, under which their lowering fails, so they ask for
# lane semantics by name.
LANE = plgpu.LoweringSemantics.Lane
# plgpu.load's index of the whole ref: jax 0.10 requires one (() for all of it), 0.11 takes it
# optionally and 0.12 takes none.
WHOLE = ((),) if "idx" in inspect.signature(plgpu.load).parameters else ()


class Ops(NamedTuple):
  """The kernel's products and layouts, compiled (wgmma) or interpreted (module docstring)."""

  interpret: bool

  def mma(self, a, b_ref, *, transpose_b: bool = False, acc=None):
    """a @ b (a @ b^T when transpose_b) in float32, added to acc when given. a: a shared-memory
    ref or a register array (bfloat16), b_ref: a shared-memory ref."""
    if self.interpret:
      a_val = a[...] if is_ref(a) else a
      b_val = b_ref[...]
      dims = (((1,), (1,)) if transpose_b else ((1,), (0,)), ((), ()))
      out = lax.dot_general(a_val, b_val, dims, preferred_element_type=F32)
      return out if acc is None else acc + out
    b = b_ref.transpose((1, 0)) if transpose_b else b_ref  # 0.12 dropped plgpu.transpose_ref
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

  def load(self, ref, along: int = 1, swizzle: Optional[int] = None):
    """A shared-memory ref's value: a 1-D ref as a vector to broadcast along dim `along` of a
    tile (1: one value per row, 0: one per column), a 2-D one as a tile: in the WGMMA layout,
    or given its swizzle (bytes) in the layout of swizzled copies, 16 bytes a thread
    (plgpu.Layout.SMEM_GMEM_COPY; a quarter of the WGMMA layout's 4-byte loads and stores),
    for elementwise work with tiles of its shape, dtype and swizzle loaded alike."""
    if self.interpret:
      return ref[...]
    if swizzle is not None:
      layout = plgpu.Layout.SMEM_GMEM_COPY(tuple(ref.shape), ref.dtype, swizzle)
    elif len(ref.shape) == 2:
      layout = plgpu.Layout.WGMMA
    else:
      layout = plgpu.Layout.WGMMA.reduce(along)
    return plgpu.load(ref, *WHOLE, layout=layout)

  def iota(self, shape, dim: int):
    if self.interpret:
      return lax.broadcasted_iota(jnp.int32, shape, dim)
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def placeholder():
  """A one-word shared-memory buffer standing where a kernel variant needs none (the swap
  matrix under slices, rotated copies under in-place rotation): every variant then unpacks its
  scratch the same way."""
  return plgpu.SMEM((1,), F32)


def is_ref(x) -> bool:
  """Whether x is a ref (shared memory) rather than a value (registers)."""
  return hasattr(x, "transforms") or isinstance(jax.typeof(x), jax.ref.AbstractRef)


def across(v, shape, along: int):
  """A vector broadcast into a tile: one value per row (along=1) or per column (along=0)."""
  return lax.broadcast_in_dim(v, shape, [1 - along])


def copy_from_first(wg, pairs, bar) -> int:
  """Warpgroup 0 of a multi-warpgroup program issues the TMA copy of each (source, shared-memory
  destination) pair on its own barrier, bar.at[i]; every warpgroup waits on them. Returns how
  many there are."""

  @pl.when(wg == 0)
  def _():
    for n, (src, dst) in enumerate(pairs):
      plgpu.copy_gmem_to_smem(src, dst, bar.at[n])

  return len(pairs)


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


def dims(plan, q, k):
  """(B, T, H, D, S, K) of a kernel's q and k operands: q [B, T, H, D] and k [B, S, K, D], or
  with plan.packed the one [B, T, 3, H, D] buffer both are (S = T, K = H)."""
  if plan.packed:
    B, T, _, H, D = q.shape
    return B, T, H, D, T, H
  B, T, H, D = q.shape
  return B, T, H, D, k.shape[1], k.shape[2]


def unpacked(plan, q_ref, k_ref, v_ref):
  """The q [B, T, H, D], k and v [B, S, K, D] refs a kernel body indexes: as given, or with
  plan.packed slices 0, 1 and 2 of the [B, T, 3, H, D] buffer each of them is (TMA copies
  read the heads in place, strided)."""
  if not plan.packed:
    return q_ref, k_ref, v_ref
  return q_ref.at[:, :, 0], k_ref.at[:, :, 1], v_ref.at[:, :, 2]


def forward_io(plan, small, q_BTHD, k_BSKD, v_BSKD):
  """(the forward kernels' inputs in their refs' order: constants, swap matrix, q and kv
  positions, q and kv segment ids when segmented, q, k, v; the types of their outputs: o
  [B, T, H, D] in q's dtype, lse [B, H, T] float32). small: the kernel's (constants, swap,
  positions, segments); with plan.packed q, k and v are one buffer (`dims`)."""
  consts, swap, q_pos, kv_pos, q_seg, kv_seg = small
  args = [consts, swap, q_pos, kv_pos]
  if plan.segmented:
    args += [q_seg, kv_seg]
  B, T, H, D, _, _ = dims(plan, q_BTHD, k_BSKD)
  out_type = [
    jax.ShapeDtypeStruct((B, T, H, D), q_BTHD.dtype),
    jax.ShapeDtypeStruct((B, H, T), F32),
  ]
  return args + [q_BTHD, k_BSKD, v_BSKD], out_type


def fetch_keys(plan, srcs, dsts, bar, b, kh, j, slot) -> None:
  """Issues the TMA copies of key block j of example b, kv head kh (k, v, positions and, when
  segmented, segment ids) into `slot` of their double buffers, each on its own barrier:
  bar.at[slot * n + i] for the i-th of the n copies. srcs: (k, v, kv positions or None (not
  copied), kv segment ids or None) in HBM; dsts(slot): their shared-memory destinations in the
  same order."""
  keys = pl.ds(j * plan.bk, plan.bk)
  k_ref, v_ref, pos_ref, seg_ref = srcs
  k_s, v_s, pos_s, seg_s = dsts(slot)
  pairs = [(k_ref.at[b, keys, kh], k_s), (v_ref.at[b, keys, kh], v_s)]
  if pos_ref is not None:
    pairs.append((pos_ref.at[b, keys], pos_s))
  if plan.segmented:
    pairs.append((seg_ref.at[b, keys], seg_s))
  for i, (src, dst) in enumerate(pairs):
    plgpu.copy_gmem_to_smem(src, dst, bar.at[slot * len(pairs) + i])


def first_key_fetches(fetch, nk: int, n_blocks, fetch_tables=None) -> None:
  """The copies a loop over key blocks starts with: fetch(0, 0) (and fetch_tables(0) where the
  tables come into one slot of their own), and fetch(1, 1) where the program reads a second
  block (nk > 1 keeps the slice in bounds)."""
  fetch(0, 0)
  if fetch_tables is not None:
    fetch_tables(0)
  if nk > 1:
    pl.when(n_blocks > 1)(lambda: fetch(1, 1))


def wait_block(bar, slot, n: int, tables_bar=None) -> None:
  """Waits for the n copies of a looped block into `slot` (bar.at[slot * n + i], as
  `fetch_keys` issues them) and, where its tables come into one slot of their own
  (`fetch_tables`), for those on tables_bar."""
  for i in range(n):
    plgpu.barrier_wait(bar.at[slot * n + i])
  if tables_bar is not None:
    plgpu.barrier_wait(tables_bar)


def fetch_tables(tables_ref, tabs_s, bar, b, j, n: int) -> None:
  """Issues the TMA copy of block j's tables (n rows of example b's `key_tables`) into the one
  slot tabs_s [1, n, 2 r] (rotation.tables_in_one_slot) on barrier `bar`."""
  plgpu.copy_gmem_to_smem(tables_ref.at[b, pl.ds(j * n, n)], tabs_s.at[0], bar)


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
  p = exp_minus(s, m_safe, 1)
  alpha = jnp.exp2((m_prev - m_safe) * trig.LOG2E)
  l_next = alpha * l_prev + p.sum(axis=1)
  acc = ops.mma(p.astype(values_ref.dtype), values_ref, acc=across(alpha, acc.shape, 1) * acc)
  return acc, m_next, l_next


def exp_minus(s, shift, along: int):
  """exp(s - shift) of a tile [n, m], shift one value a row (along=1) or a column (along=0):
  trig.exp_minus, whose exp2 is the GPU's ex2 instruction under run_kernel's approximate math (a
  relative error near 2**-22, below the bfloat16 rounding p takes next)."""
  return trig.exp_minus(s, shift, lambda v: across(v, s.shape, along))


def softmax_end(carry):
  """(o [bq, D] float32, logsumexp [bq]) of the last carry; rows that saw no key: o 0, lse
  +inf."""
  acc, m, l = carry
  seen = l > 0.0
  safe_l = jnp.where(seen, l, 1.0)
  return acc / across(safe_l, acc.shape, 1), jnp.where(seen, m + jnp.log(safe_l), jnp.inf)


def warpgroups(options: dict) -> int:
  """The most warpgroups a program of a variant runs (fused_hopper.kernel's arguments)."""
  forward = options.get("compute_wgs", 1) + bool(options.get("producer"))
  return max(forward, options.get("backward_wgs", 1) + bool(options.get("backward_producer")))


def named(plan: Plan, part: str, body):
  """body under the kernel name rotary_flash_<part>[_slices]_<rove or rope> (part: fwd,
  fwd_2wg[_tma], dq, dkv; _slices with plan.slice_swap, _slices_bf16 with plan.bf16_turns too),
  the name profiler traces and Mosaic
  GPU's dumps show (a functools.partial has none)."""

  def kernel(*refs):
    return body(*refs)

  slices = ("_slices" if plan.slice_swap else "") + ("_bf16" if plan.bf16_turns else "")
  kernel.__name__ = f"rotary_flash_{part}{slices}_{'rove' if plan.rotate_values else 'rope'}"
  return kernel


def run_kernel(plan: Plan, body, out_type, scratch, grid, grid_names, *args, **threads):
  """plgpu.kernel(body), compiled or interpreted by plan; one warpgroup a program unless
  threads gives num_threads and thread_name. Approximate math: exp2, log, sin and cos take the
  GPU's ex2, lg2, sin.approx and cos.approx (sin and cos only of trig.sincos's reduced angle,
  within [-pi, pi]); the kernels call no other function it changes (their divisions exact).
  Interpreted with more than one warpgroup, it can hang where XLA's CPU pool is too small
  (mgpu_interpret.interpret_pool_problem)."""
  return plgpu.kernel(
    body,
    **threads,
    out_type=out_type,
    scratch_types=scratch,
    grid=grid,
    grid_names=grid_names,
    interpret=interpret_params() if plan.interpret else None,
    compiler_params=plgpu.CompilerParams(approx_math=True, lowering_semantics=LANE),
  )(*args)


def mask_on_diagonal_only(plan: Plan) -> bool:
  """Whether causality by index is all the mask (causal, no segment ids): then a block pair
  wholly below the diagonal needs no mask code, which the forward, dq (`key_block_loop`) and
  dk/dv kernels leave out there."""
  return plan.causal and not plan.segmented


def key_block_loop(plan: Plan, q_start, n_blocks, step, carry):
  """lax.fori_loop of step(j, carry, masked) over key blocks 0 .. n_blocks - 1 of a program
  whose first query is q_start. Where causality by index is all the mask (causal, no segment
  ids), the blocks whose every key is at or before q_start see no mask: they run first, in a
  loop of their own whose code has none (the mask's compares and selects are about 130
  instructions a thread a block at D = 64; only the blocks on the diagonal keep them)."""
  if not mask_on_diagonal_only(plan):
    return lax.fori_loop(0, n_blocks, step, carry)
  n_free = jnp.minimum(lax.div(q_start + 1, plan.bk), n_blocks)
  carry = lax.fori_loop(0, n_free, lambda j, c: step(j, c, masked=False), carry)
  return lax.fori_loop(n_free, n_blocks, step, carry)


def last_key_block(plan: Plan, q_start, n_kv_blocks: int):
  """The last key block a query block starting at q_start reads (all without causality)."""
  if not plan.causal:
    return n_kv_blocks - 1
  return jnp.minimum(lax.div(q_start + plan.bq - 1, plan.bk), n_kv_blocks - 1)
