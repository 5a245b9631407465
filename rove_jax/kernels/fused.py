"""The fused kernel: TPU flash attention (Pallas) that takes unrotated q, k, v with their
positions and the rotary setup, and rotates inside: q and k (RoPE) and v (RoVE) per tile in
VMEM, the output back by R_i^-1 (RoVE), and in the backward pass dO by R_i and dq, dk, dv back.
No rotated tensor is written to HBM.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim, P rotary pairs.

The math (R orthogonal): with q_r = R_i q, k_r = R_j k, v_r = R_j v, the forward pass is flash
attention on rotated tiles with the epilogue o = R_i^-1 o_r. Backward: rowsum(dO . O) is
unchanged by the rotation, dO_r = R_i dO, and dq = R_i^-1 dq_r, dk = R_j^-1 dk_r,
dv = R_j^-1 dv_r, each applied to a tile already in VMEM (rove_jax.kernels.fused_backward).

How it runs:
  * One grid step holds a query block of every head of one example ([H, bq, D]) and a key/value
    block of every kv head ([K, bk, D]): the rotation tables of a block (cos and sin of
    position times frequency, computed in the kernel from the positions) are built once a step
    and serve all heads, and positions are read once a block, not once a head. GQA/MQA: query
    head h reads kv head h // G; dk and dv sum their G query heads in float32 in the kernel.
  * Layouts: both are handled in the kernel, by the same code: a pair's partner is read with two
    lane rotations (pltpu.roll) and the members combined by per-dim tables (see
    rove_jax.kernels.fused_tiles), so "interleaved" costs what "half" costs. A one-time
    permutation of the projection weights (interleaved -> half) would give equal scores but
    change the meaning of every stored parameter, KV cache and export, and every other kernel
    and the decoding path would then need the permuted layout too; it would buy nothing here.
  * Partial rotary: pass-through dims have frequency 0 (cos 1, sin 0), so they are untouched.
  * The softmax scale and the attention factor (YaRN's c, as c**2 on q's rotated dims; see
    rove_jax.attention) multiply rotated q in float32 before its one rounding to q.dtype.
  * Masks by index, like splash: the Mask must be `ordered` (query i and key i at the same
    position, positions growing with the index within each segment), causal or not, with
    segment ids or not, and no kv_valid, window or bias. Rows that see no key return 0.
  * Lengths T and S must be multiples of 128; blocks are the largest multiples of 128 that
    divide them, at most `block_size`, and small enough that a step's blocks of every head
    fit VMEM (`vmem_bytes`, VMEM_BUDGET). The head dim must be even and at most 256.
  * Under an active mesh (jax.set_mesh) the kernel runs in jax.shard_map, batch over
    ("data", "fsdp") and heads over "tensor", as the splash kernel does, because GSPMD cannot
    partition a Mosaic custom call. Off TPU it runs in Pallas interpret mode (how the tests check
    it on CPU).
  * No gradient flows to the rotary tables or the attention factor (constants of the setup).

Cost estimate (pl.CostEstimate of each of the three pallas_calls, in the accounting of jax's
Pallas TPU flash attention: every operand and result once, FLOPs of the block pairs that run),
with N = B * H * bq * bk * (block pairs the causal mask leaves) scores:
  bytes_accessed = the sizes of the call's inputs and outputs, each once;
  flops = 2 * D * N * (2 forward: q.k, p.v; 3 dq: q.k, dO.v, ds.k; 4 dkv: k.q, p.dO, v.dO,
          ds.q) + 6 * D per rotated row + 3 * D per row of rotation tables;
  transcendentals = N (exp) + 2 * D per row of rotation tables (cos, sin).
fused_tiles.cost counts the rows each kernel rotates.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from rove_jax.kernels import fused_backward, fused_tiles, mesh, platform
from rove_jax.kernels.call import KINDS, Kernel, KernelCall
from rove_jax.kernels.fused_tiles import Plan

LANES = fused_tiles.LANES  # every block (and so every length) is a multiple of it
DEFAULT_BLOCK = 256
MAX_HEAD_DIM = 256
# What the blocks may take of VMEM: under the 16 MiB a kernel gets by default on v4 and v5e.
# `vmem_bytes` is checked against libtpu's own figures in bench/RESULTS.md.
VMEM_BUDGET = 15.25 * 2**20
HALF_PAIRS = False  # no layout is known to rotate more cheaply here (kernels.Kernel.half_pairs)


def problem(q_shape, k_shape, mask, rope, dtype=None) -> Optional[str]:
  """None when the fused kernel can run a call (q [B, T, H, D], k [B, S, K, D], a kernels.Mask,
  a rotary.Rope; dtype, q's, is any float dtype here); otherwise the reason, for an error
  message."""
  del dtype  # every float dtype runs
  reason = rotary_problem(mask, rope)
  if reason is not None:
    return reason
  (_, T, H, D), (_, S, K, _) = q_shape, k_shape
  if min(T, S, H, K, D) < 1:
    return f"every size must be positive, got T={T}, S={S}, H={H}, K={K}, D={D}"
  if H % K:
    return f"query heads H={H} are not a multiple of kv heads K={K}"
  if H > LANES:
    return f"it takes at most {LANES} query heads (one lane each for softmax statistics), got {H}"
  if D % 2 or D > MAX_HEAD_DIM:
    return f"the head dim D={D} must be even and at most {MAX_HEAD_DIM}"
  for name, n in (("query length T", T), ("kv length S", S)):
    if n % LANES:
      return f"{name}={n} is not a multiple of {LANES} (its smallest block); pad it"
  return None


def rotary_problem(mask, rope) -> Optional[str]:
  """The limits every fused kernel (TPU and GPU) shares: a one-axis Rope and an `ordered` mask
  without kv_valid or window. None when they hold, else the reason."""
  if rope is None:
    return "it rotates inside and needs a Rope (use 'splash' for attention without rotation)"
  if rope.multi_axis:
    return "it takes one position axis, not multi-axis (image/video) frequency tables"
  if not mask.ordered:
    return (
      "it masks by index: it needs a Mask with ordered=True (positions that grow with "
      "the index, T == S)"
    )
  if mask.kv_valid is not None or mask.window is not None:
    return "it takes no kv_valid or window"
  return None


def kernel(block_size: int = DEFAULT_BLOCK, interpret: Optional[bool] = None) -> Kernel:
  """The fused kernel, one that rotates inside (kernels.call): UNROTATED q, k, v, the call's
  Rope, and the call's kind of rotations.

  Args:
    block_size: largest q/kv block, a multiple of 128.
    interpret: Pallas interpret mode; None: on unless compiling for TPU
      (platform.target_platform).

  The kinds: "rope" (q and k rotated), "rove" (v by R_j and the output by R_i^-1 too) or
  "rove_rotated" (v rotated, the output left as rove_attention_rotated's R_i y_i).
  """
  if (
    isinstance(block_size, bool)
    or not isinstance(block_size, int)
    or (block_size < LANES or block_size % LANES)
  ):
    raise ValueError(f"block_size must be a positive multiple of {LANES}, got {block_size!r}")

  def attend(call: KernelCall) -> jax.Array:
    q_BTHD, k_BSKD, v_BSKD = checked_inputs(call)
    mask, rope, kind = call.mask, call.rope, call.kind
    B, T, H, D = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    reason = problem(q_BTHD.shape, k_BSKD.shape, mask, rope)
    if reason is not None:
      raise ValueError(f"kernel='fused' cannot run q {q_BTHD.shape}, k {k_BSKD.shape}: {reason}")
    run_interpreted = platform.target_platform() != "tpu" if interpret is None else interpret
    q_seg, kv_seg = mask.segments()
    plan = Plan(
      causal=mask.causal,
      segmented=q_seg is not None,
      pair_offset=1 if rope.layout == "interleaved" else rope.n_rotated // 2,
      rotate_values=kind != "rope",
      rotate_output=kind == "rove",
      bq=_fit_block(T, S, H, K, D, q_BTHD.dtype, block_size),
      bk=_fit_block(S, T, H, K, D, q_BTHD.dtype, block_size),
      interpret=bool(run_interpreted),
    )
    consts = constants(rope, D, call.scale)
    rows = lambda x, n: jnp.broadcast_to(x, (B, n)).reshape(B, 1, n)
    args = [
      rows(jnp.asarray(call.q_pos_BT, jnp.float32), T),
      rows(jnp.asarray(call.kv_pos_BS, jnp.float32), S),
    ]
    if plan.segmented:
      args += [rows(q_seg.astype(jnp.int32), T), rows(kv_seg.astype(jnp.int32), S)]
    args += [q_BTHD, k_BSKD, v_BSKD]
    run = lambda *a: _local(plan, consts, *a)
    return _sharded(run, args, B, H, K)

  return Kernel("fused", attend, rotates=True)


attend = kernel().attend


def checked_inputs(call: KernelCall):
  """The call's q, k, v as arrays, with its kind and the ranks and shapes every fused kernel
  (TPU and GPU) takes checked.

  Raises:
    ValueError: an unknown kind, or q not [B, T, H, D] and k, v not [B, S, K, D] alike.
  """
  if call.kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {call.kind!r}")
  q_BTHD, k_BSKD, v_BSKD = (jnp.asarray(x) for x in (call.q_BTHD, call.k_BSKD, call.v_BSKD))
  if q_BTHD.ndim != 4 or k_BSKD.ndim != 4 or k_BSKD.shape != v_BSKD.shape:
    raise ValueError(
      f"fused attention needs q [B, T, H, D] and k, v [B, S, K, D] of one "
      f"shape; got {q_BTHD.shape}, {k_BSKD.shape}, {v_BSKD.shape}"
    )
  return q_BTHD, k_BSKD, v_BSKD


def constants(rope, D: int, scale) -> jax.Array:
  """[CONST_ROWS, D] float32: per-dim frequency, the two pair masks, the query scale (rows of
  fused_tiles)."""
  P = rope.n_rotated // 2
  inv_freq = jnp.asarray(rope.inv_freq, jnp.float32)
  d = jnp.arange(D)
  if rope.layout == "interleaved":
    pair, first = d // 2, d % 2 == 0
  else:
    pair, first = d % P, d < P
  rotated = d < 2 * P
  freq = jnp.where(rotated, inv_freq[jnp.minimum(pair, P - 1)], 0.0)
  c2 = jnp.asarray(rope.attention_factor, jnp.float32) ** 2
  q_scale = jnp.where(rotated, c2, 1.0) * jnp.float32(scale)
  one = jnp.float32(1.0)
  rows = [
    freq,
    jnp.where(rotated & first, -one, 0.0),
    jnp.where(rotated & ~first, one, 0.0),
    q_scale,
  ]
  rows += [jnp.zeros((D,), jnp.float32)] * (fused_tiles.CONST_ROWS - len(rows))
  return jnp.stack(rows).astype(jnp.float32)


# ------------------------------------------------------------------------------ internals


def _block(n: int, block: int) -> int:
  """The largest multiple of LANES that divides n (itself a multiple) and is <= block."""
  b = min(block, n) // LANES * LANES
  while n % b:
    b -= LANES
  return b


def _fit_block(n: int, other: int, H: int, K: int, D: int, dtype, block: int) -> int:
  """The block for a length n: `_block(n, block)`, halved (to a multiple of 128 dividing n)
  while the VMEM the largest of the three kernels needs at blocks of that size, by
  `vmem_bytes`, exceeds VMEM_BUDGET."""
  b = _block(n, block)
  while b > LANES and vmem_bytes(H, K, D, dtype, b, _block(other, b)) > VMEM_BUDGET:
    b = _block(n, b - LANES)
  return b


def vmem_bytes(H: int, K: int, D: int, dtype, bq: int, bk: int) -> int:
  """An upper estimate of the VMEM the largest of the fused kernels holds at blocks bq, bk:
  the double-buffered blocks of its inputs and outputs, its scratch, and [bq, bk] float32
  temporaries. A row of D lanes takes a multiple of 128 lanes."""
  lanes = -(-D // LANES) * LANES
  s = jnp.dtype(dtype).itemsize
  row = lanes * s
  forward = (
    2 * (2 * H * bq + 2 * K * bk) * row
    + H * bq * row
    + 2 * bq * LANES * 4
    + H * bq * lanes * 4
    + 4 * bq * bk * 4
  )
  dq = (
    2 * (3 * H * bq + 2 * K * bk) * row
    + 2 * H * bq * row
    + 2 * bq * LANES * 4
    + H * bq * lanes * 4
    + 5 * bq * bk * 4
  )
  dkv = (
    2 * (2 * H * bq + 4 * K * bk) * row
    + 2 * K * bk * row
    + 2 * K * bk * lanes * 4
    + 2 * 2 * H * 8 * bq * 4
    + 5 * bq * bk * 4
  )
  return max(forward, dq, dkv)


def _sharded(run, args, B: int, H: int, K: int, packed: bool = False):
  """run(*args) on each device's shard under an active mesh (module docstring), else as is.
  args: position rows (and segment rows) [B, 1, n], then q, k, v, or with packed the one
  [B, T, 3, H, D] buffer they are (K = H)."""
  sh = mesh.shards(B, H, K)
  if sh is None:
    return run(*args)
  batch, _, heads, _ = sh.q
  tail = (P(batch, None, None, heads, None),) if packed else (sh.q, sh.kv, sh.kv)
  specs = (P(sh.batch, None, None),) * (len(args) - len(tail)) + tail
  return mesh.run_sharded(run, args, specs, sh.q, sh.free)


def _local(plan: Plan, consts, q_pos, kv_pos, *rest):
  """The kernel on the arrays one device holds: swap to heads-major, run, swap back."""
  q_seg, kv_seg = (rest[0], rest[1]) if plan.segmented else (None, None)
  q_BTHD, k_BSKD, v_BSKD = rest[-3:]
  return _fused(plan, (consts, q_pos, kv_pos, q_seg, kv_seg), q_BTHD, k_BSKD, v_BSKD)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(plan, small, q_BTHD, k_BSKD, v_BSKD):
  """small: (constants, q positions, kv positions, q segments, kv segments), the rows of
  `attend`; no gradient flows to them."""
  return _fused_fwd(plan, small, q_BTHD, k_BSKD, v_BSKD)[0]


def _fused_fwd(plan, small, q_BTHD, k_BSKD, v_BSKD):
  q_BHTD, k_BKSD, v_BKSD = (jnp.swapaxes(a, 1, 2) for a in (q_BTHD, k_BSKD, v_BSKD))
  o_BHTD, lse_BHT = _forward(plan, small, q_BHTD, k_BKSD, v_BKSD)
  o_BTHD = jnp.swapaxes(o_BHTD, 1, 2)
  return o_BTHD, (small, q_BHTD, k_BKSD, v_BKSD, o_BTHD, lse_BHT)


def _fused_bwd(plan, residuals, do_BTHD):
  small, q_BHTD, k_BKSD, v_BKSD, o_BTHD, lse_BHT = residuals
  # rowsum(dO . O) is the same before and after the output rotation (R is orthogonal).
  delta_BHT = jnp.einsum("bthd,bthd->bht", o_BTHD.astype(jnp.float32), do_BTHD.astype(jnp.float32))
  do_BHTD = jnp.swapaxes(do_BTHD, 1, 2)
  dq_BHTD, dk_BKSD, dv_BKSD = fused_backward.gradients(
    plan, small, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT
  )
  grads = tuple(jnp.swapaxes(g, 1, 2) for g in (dq_BHTD, dk_BKSD, dv_BKSD))
  consts = small[0]
  return ((jnp.zeros_like(consts), None, None, None, None),) + grads


_fused.defvjp(_fused_fwd, _fused_bwd)


def _forward(plan: Plan, small, q_BHTD, k_BKSD, v_BKSD):
  """(o [B, H, T, D] in q.dtype, logsumexp [B, H, T] float32; +inf for rows that see no
  key)."""
  consts, q_pos, kv_pos, q_seg, kv_seg = small
  B, H, T, D = q_BHTD.shape
  K, S = k_BKSD.shape[1], k_BKSD.shape[2]
  bq, bk = plan.bq, plan.bk
  nq, nk = T // bq, S // bk
  # Key blocks above the causal diagonal are skipped: point them at the last block read, so
  # the pipeline fetches nothing new for them.
  kv_at = lambda i, j: jnp.minimum(j, fused_tiles.last_key_block(plan, i, nk))
  q_row = pl.BlockSpec((None, 1, bq), lambda b, i, j: (b, 0, i))
  kv_row = pl.BlockSpec((None, 1, bk), lambda b, i, j: (b, 0, kv_at(i, j)))
  q_spec = pl.BlockSpec((None, H, bq, D), lambda b, i, j: (b, 0, i, 0))
  kv_spec = pl.BlockSpec((None, K, bk, D), lambda b, i, j: (b, 0, kv_at(i, j), 0))
  seg_specs = [q_row, kv_row] if plan.segmented else [None, None]
  in_specs = [
    pl.BlockSpec((fused_tiles.CONST_ROWS, D), lambda b, i, j: (0, 0)),
    q_row,
    kv_row,
    *seg_specs,
    q_spec,
    kv_spec,
    kv_spec,
  ]
  out_shape = [
    jax.ShapeDtypeStruct(q_BHTD.shape, q_BHTD.dtype),
    jax.ShapeDtypeStruct((B, H, T), jnp.float32),
  ]
  out_specs = [q_spec, pl.BlockSpec((None, H, bq), lambda b, i, j: (b, 0, i))]
  scratch = [
    pltpu.VMEM((H, bq, D), q_BHTD.dtype),  # rotated, scaled q
    pltpu.VMEM((bq, LANES), jnp.float32),  # running max, head h in lane h
    pltpu.VMEM((bq, LANES), jnp.float32),  # running sum, head h in lane h
    pltpu.VMEM((H, bq, D), jnp.float32),
  ]  # output accumulator
  args = (consts, q_pos, kv_pos, q_seg, kv_seg, q_BHTD, k_BKSD, v_BKSD)
  return pl.pallas_call(
    functools.partial(_forward_kernel, plan, nk),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(B, nq, nk),
      in_specs=in_specs,
      out_specs=out_specs,
      scratch_shapes=scratch,
    ),
    out_shape=out_shape,
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    cost_estimate=fused_tiles.cost(plan, "forward", q_BHTD.shape, S, K, args, out_shape),
    interpret=plan.interpret,
    name="fused_rotary_attention_fwd",
  )(*args)


def _forward_kernel(plan: Plan, nk: int, *refs):
  """refs: the inputs (constants, position rows, segment rows (None refs without segment
  ids), q, k, v), the outputs (o, lse) and the scratch (rotated q, running max and sum,
  accumulator), in pallas_call's order."""
  (
    consts_ref,
    q_pos_ref,
    kv_pos_ref,
    q_seg_ref,
    kv_seg_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    lse_ref,
    qr_ref,
    m_ref,
    l_ref,
    acc_ref,
  ) = refs
  qi, ki = pl.program_id(1), pl.program_id(2)
  H, K = q_ref.shape[0], k_ref.shape[0]
  G = H // K
  off, f32 = plan.pair_offset, jnp.float32
  precision = fused_tiles.precision_for(q_ref.dtype)

  @pl.when(ki == 0)
  def _init():
    tabs = fused_tiles.tables(fused_tiles.column(q_pos_ref), consts_ref)
    scale_1D = fused_tiles.query_scale(consts_ref)
    for h in range(H):
      q_r = fused_tiles.rotate(q_ref[h].astype(f32), tabs, off) * scale_1D
      qr_ref[h] = q_r.astype(qr_ref.dtype)
    m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, f32)
    l_ref[...] = jnp.zeros(l_ref.shape, f32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, f32)

  @pl.when(fused_tiles.block_runs(plan, qi, ki))
  def _step():
    tabs = fused_tiles.tables(fused_tiles.column(kv_pos_ref), consts_ref)
    q_seg = fused_tiles.column(q_seg_ref) if plan.segmented else None
    kv_seg = kv_seg_ref[...] if plan.segmented else None
    mask = fused_tiles.visible(plan, qi, ki, q_seg, kv_seg, keys_in_rows=False)
    for kh in range(K):
      k_r = fused_tiles.rotate(k_ref[kh].astype(f32), tabs, off).astype(k_ref.dtype)
      v_r = v_ref[kh]
      if plan.rotate_values:
        v_r = fused_tiles.rotate(v_r.astype(f32), tabs, off).astype(v_ref.dtype)
      for h in range(kh * G, (kh + 1) * G):
        s = fused_tiles.dot_nt(qr_ref[h], k_r, precision)  # [bq, bk]
        if mask is not None:
          s = jnp.where(mask, s, -jnp.inf)
        m_prev = m_ref[:, h : h + 1]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)  # a row with nothing visible yet
        p = jnp.exp(s - m_safe)
        alpha = jnp.exp(m_prev - m_safe)
        l_ref[:, h : h + 1] = alpha * l_ref[:, h : h + 1] + jnp.sum(p, axis=1, keepdims=True)
        acc_ref[h] = alpha * acc_ref[h] + fused_tiles.dot_nn(p.astype(v_r.dtype), v_r, precision)
        m_ref[:, h : h + 1] = m_next

  @pl.when(ki == nk - 1)
  def _finish():
    tabs = (
      fused_tiles.tables(fused_tiles.column(q_pos_ref), consts_ref) if plan.rotate_output else None
    )
    for h in range(H):
      l = l_ref[:, h : h + 1]
      seen = l > 0.0
      o = acc_ref[h] / jnp.where(seen, l, 1.0)
      if plan.rotate_output:
        o = fused_tiles.rotate(o, tabs, off, inverse=True)
      o_ref[h] = o.astype(o_ref.dtype)
      lse = jnp.where(seen, m_ref[:, h : h + 1] + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)
      lse_ref[h : h + 1, :] = fused_tiles.to_row(lse)
