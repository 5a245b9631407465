"""The GPU fused kernel's backward pass: two Pallas (Triton) kernels, dq (one program a query
block of a head, looping over key blocks) and dk, dv (one program a key block of a kv head,
looping over its G query heads and their query blocks), each rotating the tiles it reads and
its gradients back before they are stored. The math is rove_jax.kernels.fused_backward's:

  p = exp(q_r . k_r - lse),  ds = p * (dO_r . v_r - delta)
  dq_r += ds . k_r                -> dq = scale * C^2 * R_i^-1 dq_r
  dk_r += ds^T . q_r,  dv_r += p^T . dO_r  -> dk = R_j^-1 dk_r, dv = R_j^-1 dv_r (RoVE)

with q_r = scale * C^2 * R_i q, k_r = R_j k, v_r = R_j v (RoVE; v otherwise), dO_r = R_i dO
(RoVE; dO otherwise). The dk, dv kernel works on transposed scores [bk, bq].

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rove_jax.kernels import fused_tiles, trig
from rove_jax.kernels.fused_gpu_tiles import compiler_params, kernel_name, rotate, tables
from rove_jax.kernels.fused_tiles import Plan


def gradients(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT):
  """(dq [B, T, H, D], dk [B, S, K, D], dv [B, S, K, D]) in the inputs' dtypes."""
  args = (q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT)
  return (_dq(plan, small, *args),) + tuple(_dkv(plan, small, *args))


def _dq(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT):
  consts, swap, q_pos, kv_pos, q_seg, kv_seg = small
  B, T, H, D = q_BTHD.shape
  S, K = k_BSKD.shape[1], k_BSKD.shape[2]
  G, bq = H // K, plan.bq
  whole = lambda a: pl.BlockSpec(a.shape, lambda i, b, h: (0,) * a.ndim)
  q_row = pl.BlockSpec((None, None, bq), lambda i, b, h: (b, 0, i))
  kv_row = pl.BlockSpec((None, None, S), lambda i, b, h: (b, 0, 0))
  q_spec = pl.BlockSpec((None, bq, None, D), lambda i, b, h: (b, i, h, 0))
  kv_spec = pl.BlockSpec((None, S, None, D), lambda i, b, h: (b, 0, jax.lax.div(h, G), 0))
  stat_spec = pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i))
  seg_specs = [q_row, kv_row] if plan.segmented else [None, None]
  in_specs = [
    whole(consts),
    whole(swap),
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
  return pl.pallas_call(
    functools.partial(_dq_kernel, plan),
    grid=(T // bq, B, H),
    in_specs=in_specs,
    out_specs=q_spec,
    out_shape=jax.ShapeDtypeStruct(q_BTHD.shape, q_BTHD.dtype),
    compiler_params=compiler_params(backward=True),
    interpret=plan.interpret,
    name=kernel_name(plan, "dq"),
  )(consts, swap, q_pos, kv_pos, q_seg, kv_seg, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT)


def _dq_kernel(plan: Plan, *refs):
  """One query block of one head: q, dO [bq, D], the whole k, v [S, D] of its kv head.
  refs: the inputs and outputs in pallas_call's order, unpacked below."""
  (
    consts_ref,
    swap_ref,
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
  ) = refs
  qi = pl.program_id(0)
  bk = plan.bk
  nk = k_ref.shape[0] // bk
  precision = fused_tiles.precision_for(q_ref.dtype)
  scale_1D = fused_tiles.query_scale(consts_ref)
  q_tabs = tables(q_pos_ref, consts_ref)
  q_r = (rotate(q_ref[...], q_tabs, swap_ref) * scale_1D).astype(q_ref.dtype)
  do_r = do_ref[...]
  if plan.rotate_output:
    do_r = rotate(do_r, q_tabs, swap_ref).astype(do_ref.dtype)
  lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]
  q_seg = q_seg_ref[...][:, None] if plan.segmented else None

  def step(ki, acc):
    keys = pl.ds(ki * bk, bk)
    tabs = tables(kv_pos_ref, consts_ref, keys)
    k_r = rotate(k_ref[keys, :], tabs, swap_ref).astype(k_ref.dtype)
    v_r = v_ref[keys, :]
    if plan.rotate_values:
      v_r = rotate(v_r, tabs, swap_ref).astype(v_ref.dtype)
    s = fused_tiles.dot_nt(q_r, k_r, precision)  # [bq, bk]
    kv_seg = kv_seg_ref[keys][None, :] if plan.segmented else None
    mask = fused_tiles.visible(plan, qi, ki, q_seg, kv_seg, keys_in_rows=False)
    if mask is not None:
      s = jnp.where(mask, s, -jnp.inf)
    p = trig.exp_minus(s, lse)  # lse: [bq, 1]
    ds = p * (fused_tiles.dot_nt(do_r, v_r, precision) - delta)
    return acc + fused_tiles.dot_nn(ds.astype(k_r.dtype), k_r, precision)

  acc = jnp.zeros(q_ref.shape, jnp.float32)
  acc = jax.lax.fori_loop(0, fused_tiles.last_key_block(plan, qi, nk) + 1, step, acc)
  # The query tables again, not held across the loop.
  dq = rotate(acc * scale_1D, tables(q_pos_ref, consts_ref), swap_ref, inverse=True)
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv(plan: Plan, small, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT):
  consts, swap, q_pos, kv_pos, q_seg, kv_seg = small
  B, T, H, D = q_BTHD.shape
  S, K = k_BSKD.shape[1], k_BSKD.shape[2]
  G, bk = H // K, plan.bk
  whole = lambda a: pl.BlockSpec(a.shape, lambda j, b, kh: (0,) * a.ndim)
  q_row = pl.BlockSpec((None, None, T), lambda j, b, kh: (b, 0, 0))
  kv_row = pl.BlockSpec((None, None, bk), lambda j, b, kh: (b, 0, j))
  # The G query heads of kv head kh: block kh of G heads.
  q_spec = pl.BlockSpec((None, T, G, D), lambda j, b, kh: (b, 0, kh, 0))
  kv_spec = pl.BlockSpec((None, bk, None, D), lambda j, b, kh: (b, j, kh, 0))
  stat_spec = pl.BlockSpec((None, G, T), lambda j, b, kh: (b, kh, 0))
  seg_specs = [q_row, kv_row] if plan.segmented else [None, None]
  in_specs = [
    whole(consts),
    whole(swap),
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
    jax.ShapeDtypeStruct(k_BSKD.shape, k_BSKD.dtype),
    jax.ShapeDtypeStruct(v_BSKD.shape, v_BSKD.dtype),
  ]
  return pl.pallas_call(
    functools.partial(_dkv_kernel, plan),
    grid=(S // bk, B, K),
    in_specs=in_specs,
    out_specs=[kv_spec, kv_spec],
    out_shape=out_shape,
    compiler_params=compiler_params(backward=True),
    interpret=plan.interpret,
    name=kernel_name(plan, "dkv"),
  )(consts, swap, q_pos, kv_pos, q_seg, kv_seg, q_BTHD, k_BSKD, v_BSKD, do_BTHD, lse_BHT, delta_BHT)


def _dkv_kernel(plan: Plan, *refs):
  """One key block of one kv head: k, v [bk, D], the whole q, dO [T, G, D] of its G query
  heads and their lse, delta [G, T].
  refs: the inputs and outputs in pallas_call's order, unpacked below."""
  (
    consts_ref,
    swap_ref,
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
  ) = refs
  ki = pl.program_id(0)
  bq, f32 = plan.bq, jnp.float32
  T, G = q_ref.shape[0], q_ref.shape[1]
  nq = T // bq
  precision = fused_tiles.precision_for(q_ref.dtype)
  scale_1D = fused_tiles.query_scale(consts_ref)
  kv_tabs = tables(kv_pos_ref, consts_ref)
  k_r = rotate(k_ref[...], kv_tabs, swap_ref).astype(k_ref.dtype)
  v_r = v_ref[...]
  if plan.rotate_values:
    v_r = rotate(v_r, kv_tabs, swap_ref).astype(v_ref.dtype)
  kv_seg = kv_seg_ref[...][:, None] if plan.segmented else None

  def step(qi, carry, g):
    dk_r, dv_r = carry
    rows = pl.ds(qi * bq, bq)
    tabs = tables(q_pos_ref, consts_ref, rows)
    q_r = (rotate(q_ref[rows, g, :], tabs, swap_ref) * scale_1D).astype(q_ref.dtype)
    do_r = do_ref[rows, g, :]
    if plan.rotate_output:
      do_r = rotate(do_r, tabs, swap_ref).astype(do_ref.dtype)
    s_t = fused_tiles.dot_nt(k_r, q_r, precision)  # [bk, bq]
    q_seg = q_seg_ref[rows][None, :] if plan.segmented else None
    mask = fused_tiles.visible(plan, qi, ki, q_seg, kv_seg, keys_in_rows=True)
    if mask is not None:
      s_t = jnp.where(mask, s_t, -jnp.inf)
    p_t = trig.exp_minus(s_t, lse_ref[g, rows], lambda v: v[None, :])
    ds_t = p_t * (fused_tiles.dot_nt(v_r, do_r, precision) - delta_ref[g, rows][None, :])
    dv_r = dv_r + fused_tiles.dot_nn(p_t.astype(do_r.dtype), do_r, precision)
    dk_r = dk_r + fused_tiles.dot_nn(ds_t.astype(q_r.dtype), q_r, precision)
    return dk_r, dv_r

  first = fused_tiles.first_query_block(plan, ki)
  head = lambda g, carry: jax.lax.fori_loop(first, nq, functools.partial(step, g=g), carry)
  zeros = jnp.zeros(k_ref.shape, f32)
  dk_r, dv_r = jax.lax.fori_loop(0, G, head, (zeros, zeros))
  kv_tabs = tables(kv_pos_ref, consts_ref)  # again, not held across the loops
  dk_ref[...] = rotate(dk_r, kv_tabs, swap_ref, inverse=True).astype(dk_ref.dtype)
  if plan.rotate_values:
    dv_r = rotate(dv_r, kv_tabs, swap_ref, inverse=True)
  dv_ref[...] = dv_r.astype(dv_ref.dtype)
