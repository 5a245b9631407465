"""The fused kernel's backward pass: two Pallas kernels, dq (grid over query blocks, key blocks
inner) and dk, dv (grid over key blocks, query blocks inner), each rotating the tiles it reads
and rotating its gradients back before they leave VMEM (rove_jax.kernels.fused has the math).

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.

Per block pair, with q_r = scale * C^2 * R_i q (scaled as in the forward), k_r = R_j k,
v_r = R_j v (RoVE; v otherwise), dO_r = R_i dO (RoVE; dO otherwise), lse and
delta = rowsum(dO . O) from the forward:
  p = exp(q_r . k_r - lse),  ds = p * (dO_r . v_r - delta)
  dq_r += ds . k_r                -> dq = scale * C^2 * R_i^-1 dq_r
  dk_r += ds^T . q_r,  dv_r += p^T . dO_r  -> dk = R_j^-1 dk_r, dv = R_j^-1 dv_r (RoVE)
The dk, dv kernel works on the transposed scores [bk, bq], so every matmul there is plain or
against a transposed right operand, and lse and delta are rows; GQA's G query heads add into
their kv head's accumulators in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from rove_jax.kernels import fused_tiles
from rove_jax.kernels.fused_tiles import LANES, Plan


def gradients(plan: Plan, small, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT):
  """(dq [B, H, T, D], dk [B, K, S, D], dv [B, K, S, D]) in the inputs' dtypes."""
  dq = _dq(plan, small, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT)
  dk, dv = _dkv(plan, small, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT)
  return dq, dk, dv


def _dq(plan: Plan, small, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT):
  consts, q_pos, kv_pos, q_seg, kv_seg = small
  B, H, T, D = q_BHTD.shape
  K, S = k_BKSD.shape[1], k_BKSD.shape[2]
  bq, bk = plan.bq, plan.bk
  nq, nk = T // bq, S // bk
  kv_at = lambda i, j: jnp.minimum(j, fused_tiles.last_key_block(plan, i, nk))
  q_row = pl.BlockSpec((None, 1, bq), lambda b, i, j: (b, 0, i))
  kv_row = pl.BlockSpec((None, 1, bk), lambda b, i, j: (b, 0, kv_at(i, j)))
  q_spec = pl.BlockSpec((None, H, bq, D), lambda b, i, j: (b, 0, i, 0))
  kv_spec = pl.BlockSpec((None, K, bk, D), lambda b, i, j: (b, 0, kv_at(i, j), 0))
  stat_spec = pl.BlockSpec((None, H, bq), lambda b, i, j: (b, 0, i))
  seg_specs = [q_row, kv_row] if plan.segmented else [None, None]
  in_specs = [
    pl.BlockSpec((fused_tiles.CONST_ROWS, D), lambda b, i, j: (0, 0)),
    q_row,
    kv_row,
    *seg_specs,
    q_spec,
    kv_spec,
    kv_spec,
    q_spec,
    stat_spec,
    stat_spec,
  ]
  out_shape = jax.ShapeDtypeStruct(q_BHTD.shape, q_BHTD.dtype)
  scratch = [
    pltpu.VMEM((H, bq, D), q_BHTD.dtype),  # rotated, scaled q
    pltpu.VMEM((H, bq, D), do_BHTD.dtype),  # dO_r (RoVE; unused for RoPE)
    pltpu.VMEM((bq, LANES), jnp.float32),  # lse as columns, head h in lane h
    pltpu.VMEM((bq, LANES), jnp.float32),  # delta as columns, head h in lane h
    pltpu.VMEM((H, bq, D), jnp.float32),
  ]  # dq_r accumulator
  args = (consts, q_pos, kv_pos, q_seg, kv_seg, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT)
  return pl.pallas_call(
    functools.partial(_dq_kernel, plan, nk),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(B, nq, nk),
      in_specs=in_specs,
      out_specs=q_spec,
      scratch_shapes=scratch,
    ),
    out_shape=out_shape,
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    cost_estimate=fused_tiles.cost(plan, "dq", q_BHTD.shape, S, K, args, out_shape),
    interpret=plan.interpret,
    name="fused_rotary_attention_dq",
  )(*args)


def _dq_kernel(plan: Plan, nk: int, *refs):
  """refs: the inputs (constants, position rows, segment rows (None refs without segment
  ids), q, k, v, dO, lse, delta), the output dq and the scratch, in pallas_call's order."""
  (
    consts_ref,
    q_pos_ref,
    kv_pos_ref,
    q_seg_ref,
    kv_seg_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dq_ref,
    qr_ref,
    dor_ref,
    lse_col_ref,
    delta_col_ref,
    acc_ref,
  ) = refs
  qi, ki = pl.program_id(1), pl.program_id(2)
  H, K = q_ref.shape[0], k_ref.shape[0]
  G = H // K
  off, f32 = plan.pair_offset, jnp.float32
  precision = fused_tiles.precision_for(q_ref.dtype)
  scale_1D = fused_tiles.query_scale(consts_ref)

  @pl.when(ki == 0)
  def _init():
    tabs = fused_tiles.tables(fused_tiles.column(q_pos_ref), consts_ref)
    for h in range(H):
      qr_ref[h] = (fused_tiles.rotate(q_ref[h].astype(f32), tabs, off) * scale_1D).astype(
        qr_ref.dtype
      )
      if plan.rotate_output:
        dor_ref[h] = fused_tiles.rotate(do_ref[h].astype(f32), tabs, off).astype(dor_ref.dtype)
      lse_col_ref[:, h : h + 1] = fused_tiles.to_column(lse_ref[h : h + 1, :])
      delta_col_ref[:, h : h + 1] = fused_tiles.to_column(delta_ref[h : h + 1, :])
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
        do_r = dor_ref[h] if plan.rotate_output else do_ref[h]
        s = fused_tiles.dot_nt(qr_ref[h], k_r, precision)  # [bq, bk]
        if mask is not None:
          s = jnp.where(mask, s, -jnp.inf)
        p = jnp.exp(s - lse_col_ref[:, h : h + 1])
        dp = fused_tiles.dot_nt(do_r, v_r, precision)
        ds = p * (dp - delta_col_ref[:, h : h + 1])
        acc_ref[h] += fused_tiles.dot_nn(ds.astype(k_r.dtype), k_r, precision)

  @pl.when(ki == nk - 1)
  def _finish():
    tabs = fused_tiles.tables(fused_tiles.column(q_pos_ref), consts_ref)
    for h in range(H):
      dq = fused_tiles.rotate(acc_ref[h] * scale_1D, tabs, off, inverse=True)
      dq_ref[h] = dq.astype(dq_ref.dtype)


def _dkv(plan: Plan, small, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT):
  consts, q_pos, kv_pos, q_seg, kv_seg = small
  B, H, T, D = q_BHTD.shape
  K, S = k_BKSD.shape[1], k_BKSD.shape[2]
  bq, bk = plan.bq, plan.bk
  nq, nk = T // bq, S // bk
  # Query blocks before the causal diagonal are skipped: point them at the first one read.
  q_at = lambda j, i: jnp.maximum(i, fused_tiles.first_query_block(plan, j))
  q_row = pl.BlockSpec((None, 1, bq), lambda b, j, i: (b, 0, q_at(j, i)))
  kv_row = pl.BlockSpec((None, 1, bk), lambda b, j, i: (b, 0, j))
  q_spec = pl.BlockSpec((None, H, bq, D), lambda b, j, i: (b, 0, q_at(j, i), 0))
  kv_spec = pl.BlockSpec((None, K, bk, D), lambda b, j, i: (b, 0, j, 0))
  stat_spec = pl.BlockSpec((None, H, bq), lambda b, j, i: (b, 0, q_at(j, i)))
  seg_specs = [q_row, kv_row] if plan.segmented else [None, None]
  in_specs = [
    pl.BlockSpec((fused_tiles.CONST_ROWS, D), lambda b, j, i: (0, 0)),
    q_row,
    kv_row,
    *seg_specs,
    q_spec,
    kv_spec,
    kv_spec,
    q_spec,
    stat_spec,
    stat_spec,
  ]
  out_shape = [
    jax.ShapeDtypeStruct(k_BKSD.shape, k_BKSD.dtype),
    jax.ShapeDtypeStruct(v_BKSD.shape, v_BKSD.dtype),
  ]
  scratch = [
    pltpu.VMEM((K, bk, D), k_BKSD.dtype),  # k_r
    pltpu.VMEM((K, bk, D), v_BKSD.dtype),  # v_r (RoVE; v itself for RoPE)
    pltpu.VMEM((K, bk, D), jnp.float32),  # dk_r accumulator
    pltpu.VMEM((K, bk, D), jnp.float32),
  ]  # dv_r accumulator
  args = (consts, q_pos, kv_pos, q_seg, kv_seg, q_BHTD, k_BKSD, v_BKSD, do_BHTD, lse_BHT, delta_BHT)
  return pl.pallas_call(
    functools.partial(_dkv_kernel, plan, nq),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(B, nk, nq),
      in_specs=in_specs,
      out_specs=[kv_spec, kv_spec],
      scratch_shapes=scratch,
    ),
    out_shape=out_shape,
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    cost_estimate=fused_tiles.cost(plan, "dkv", q_BHTD.shape, S, K, args, out_shape),
    interpret=plan.interpret,
    name="fused_rotary_attention_dkv",
  )(*args)


def _dkv_kernel(plan: Plan, nq: int, *refs):
  """refs: the inputs (as _dq_kernel's), the outputs dk, dv and the scratch, in pallas_call's
  order."""
  (
    consts_ref,
    q_pos_ref,
    kv_pos_ref,
    q_seg_ref,
    kv_seg_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    kr_ref,
    vr_ref,
    dk_acc_ref,
    dv_acc_ref,
  ) = refs
  ki, qi = pl.program_id(1), pl.program_id(2)
  H, K = q_ref.shape[0], k_ref.shape[0]
  G = H // K
  off, f32 = plan.pair_offset, jnp.float32
  precision = fused_tiles.precision_for(q_ref.dtype)

  @pl.when(qi == 0)
  def _init():
    tabs = fused_tiles.tables(fused_tiles.column(kv_pos_ref), consts_ref)
    for kh in range(K):
      kr_ref[kh] = fused_tiles.rotate(k_ref[kh].astype(f32), tabs, off).astype(kr_ref.dtype)
      v = v_ref[kh]
      if plan.rotate_values:
        v = fused_tiles.rotate(v.astype(f32), tabs, off).astype(vr_ref.dtype)
      vr_ref[kh] = v
    dk_acc_ref[...] = jnp.zeros(dk_acc_ref.shape, f32)
    dv_acc_ref[...] = jnp.zeros(dv_acc_ref.shape, f32)

  @pl.when(fused_tiles.block_runs(plan, qi, ki))
  def _step():
    tabs = fused_tiles.tables(fused_tiles.column(q_pos_ref), consts_ref)
    scale_1D = fused_tiles.query_scale(consts_ref)
    kv_seg = fused_tiles.column(kv_seg_ref) if plan.segmented else None
    q_seg = q_seg_ref[...] if plan.segmented else None
    mask = fused_tiles.visible(plan, qi, ki, q_seg, kv_seg, keys_in_rows=True)
    for kh in range(K):
      k_r, v_r = kr_ref[kh], vr_ref[kh]
      dk_r = dv_r = None
      for h in range(kh * G, (kh + 1) * G):
        q_r = (fused_tiles.rotate(q_ref[h].astype(f32), tabs, off) * scale_1D).astype(k_r.dtype)
        do_r = do_ref[h]
        if plan.rotate_output:
          do_r = fused_tiles.rotate(do_r.astype(f32), tabs, off).astype(do_ref.dtype)
        s_t = fused_tiles.dot_nt(k_r, q_r, precision)  # [bk, bq]
        if mask is not None:
          s_t = jnp.where(mask, s_t, -jnp.inf)
        p_t = jnp.exp(s_t - lse_ref[h : h + 1, :])
        dp_t = fused_tiles.dot_nt(v_r, do_r, precision)
        ds_t = p_t * (dp_t - delta_ref[h : h + 1, :])
        dv = fused_tiles.dot_nn(p_t.astype(do_r.dtype), do_r, precision)
        dk = fused_tiles.dot_nn(ds_t.astype(q_r.dtype), q_r, precision)
        dv_r = dv if dv_r is None else dv_r + dv
        dk_r = dk if dk_r is None else dk_r + dk
      dk_acc_ref[kh] += dk_r
      dv_acc_ref[kh] += dv_r

  @pl.when(qi == nq - 1)
  def _finish():
    tabs = fused_tiles.tables(fused_tiles.column(kv_pos_ref), consts_ref)
    for kh in range(K):
      dk_ref[kh] = fused_tiles.rotate(dk_acc_ref[kh], tabs, off, inverse=True).astype(dk_ref.dtype)
      dv = dv_acc_ref[kh]
      if plan.rotate_values:
        dv = fused_tiles.rotate(dv, tabs, off, inverse=True)
      dv_ref[kh] = dv.astype(dv_ref.dtype)
