"""What the fused kernel's forward and backward bodies share: the static plan of a call and the
per-tile pieces (rotation tables from positions, the rotation itself, the mask, which blocks
run). Everything here runs inside a Pallas kernel on [rows, D] tiles in VMEM, in float32.

Shape letters: n rows of a tile (bq queries or bk keys), D head dim.

The rotation of a tile: with per-dim tables built from the tile's positions,

    C = cos(pos * f),  SA = -sin(pos * f) on the first member of each pair (0 elsewhere),
    SB = +sin(pos * f) on the second member (0 elsewhere),
    R x = x * C + ahead(x) * SA + behind(x) * SB,   R^-1 x = x * C - ahead(x) * SA - behind(x) * SB,

where f [D] is the pair's frequency on both of its dims (0 on pass-through dims, so C = 1 and
SA = SB = 0 there: partial rotary needs no branch), ahead(x)[d] = x[d + off] and
behind(x)[d] = x[d - off] are two lane rotations, and off is the distance between the members of
a pair: 1 for the "interleaved" layout, P for "half". The wrap-around of the rotations lands only
on dims whose coefficient is 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Rows of the constants array [CONST_ROWS, D] float32 every kernel reads whole.
FREQ, NEG_FIRST, SECOND, Q_SCALE = 0, 1, 2, 3
CONST_ROWS = 8  # a full sublane tile
LANES = 128  # TPU lane width


class Plan(NamedTuple):
  """The static part of one fused call (hashable: a custom_vjp nondiff argument)."""

  causal: bool  # index-causal (the Mask's `ordered` promise): key j visible iff j <= i
  segmented: bool  # segment ids given (packed documents)
  pair_offset: int  # distance between the two members of a rotation pair (module docstring)
  rotate_values: bool  # RoVE: v_r = R_j v (and dv = R_j^-1 dv_r)
  rotate_output: bool  # RoVE: o = R_i^-1 o_r (and dO_r = R_i dO)
  bq: int  # query block
  bk: int  # key/value block
  interpret: bool  # Pallas interpret mode (off TPU)
  compute_wgs: int = 1  # Hopper forward: compute warpgroups a program (fused_hopper_ws)
  producer: bool = False  # Hopper forward: a warpgroup that only copies keys and values
  slice_swap: bool = False  # Hopper: pair swaps by column slices, no swap matrix
  backward_wgs: int = 1  # Hopper dk, dv kernel: compute warpgroups a program
  packed: bool = False  # Hopper: q, k, v read in place from one [B, T, 3, H, D] buffer
  bf16_turns: bool = False  # Hopper: looped tiles turned in bfloat16 pairs (fused_hopper_rotation)
  backward_producer: bool = False  # Hopper backward_wgs=2: a producer warpgroup (..._pipe)


def column(row_ref) -> jax.Array:
  """[n, 1] from a ref holding one row [1, n] (positions and segment ids arrive as rows: a
  [B, 1, T] array is 8 sublanes a token in HBM, a [B, T, 1] one would be 128 lanes)."""
  return to_column(row_ref[...])


def to_column(row_1n) -> jax.Array:
  """[n, 1] from a row [1, n] by a 2-D transpose of its broadcast: a reshape would be a
  sublane gather, which Mosaic lowers on v5e but not on v4."""
  n = row_1n.shape[1]
  return jnp.transpose(jnp.broadcast_to(row_1n, (LANES, n)))[:, :1]


def to_row(col_n1) -> jax.Array:
  """[1, n] from a column [n, 1] (the transpose of `to_column`)."""
  n = col_n1.shape[0]
  return jnp.transpose(jnp.broadcast_to(col_n1, (n, LANES)))[:1, :]


def tables(pos_n1, consts_ref):
  """(C, SA, SB), each [n, D] float32, for positions [n, 1] (module docstring)."""
  angle_nD = pos_n1 * consts_ref[FREQ : FREQ + 1, :]
  sin_nD = jnp.sin(angle_nD)
  return (
    jnp.cos(angle_nD),
    sin_nD * consts_ref[NEG_FIRST : NEG_FIRST + 1, :],
    sin_nD * consts_ref[SECOND : SECOND + 1, :],
  )


def rotate(x_nD, tabs, offset: int, *, inverse: bool = False) -> jax.Array:
  """R x (R^-1 x when inverse) of a float32 tile [n, D] with `tables`' tables."""
  c_nD, sa_nD, sb_nD = tabs
  D = x_nD.shape[-1]
  # pltpu.roll follows jnp.roll: roll(x, s)[d] = x[d - s].
  turn = pltpu.roll(x_nD, D - offset, 1) * sa_nD + pltpu.roll(x_nD, offset, 1) * sb_nD
  return x_nD * c_nD - turn if inverse else x_nD * c_nD + turn


def query_scale(consts_ref) -> jax.Array:
  """[1, D]: the softmax scale times the attention factor squared on the rotated dims."""
  return consts_ref[Q_SCALE : Q_SCALE + 1, :]


def block_runs(plan: Plan, qi, ki):
  """Whether query block qi and key block ki share a visible pair (False only above the
  causal diagonal)."""
  if not plan.causal:
    return True
  return ki * plan.bk <= qi * plan.bq + plan.bq - 1


def visible(plan: Plan, qi, ki, q_seg, kv_seg, *, keys_in_rows: bool) -> Optional[jax.Array]:
  """The bool mask of a block pair, or None when all of it is visible.

  keys_in_rows False: [bq, bk] with q_seg a column [bq, 1] and kv_seg a row [1, bk] (forward
  and dq); True: [bk, bq] with kv_seg a column and q_seg a row (dk, dv)."""
  shape = (plan.bk, plan.bq) if keys_in_rows else (plan.bq, plan.bk)
  mask = None
  if plan.causal:
    q_axis, k_axis = (1, 0) if keys_in_rows else (0, 1)
    q_idx = qi * plan.bq + jax.lax.broadcasted_iota(jnp.int32, shape, q_axis)
    k_idx = ki * plan.bk + jax.lax.broadcasted_iota(jnp.int32, shape, k_axis)
    mask = k_idx <= q_idx
  if plan.segmented:
    same = q_seg == kv_seg if not keys_in_rows else kv_seg == q_seg
    mask = same if mask is None else jnp.logical_and(mask, same)
  return mask


def last_key_block(plan: Plan, qi, n_kv_blocks: int):
  """The last key block query block qi reads (all of them without a causal mask)."""
  if not plan.causal:
    return n_kv_blocks - 1
  # lax.div: indices are non-negative, and jnp's floor division lowers through sign, which
  # Mosaic lowers only when it knows the TPU generation.
  return jnp.minimum(jax.lax.div(qi * plan.bq + plan.bq - 1, plan.bk), n_kv_blocks - 1)


def first_query_block(plan: Plan, ki):
  """The first query block that reads key block ki (0 without a causal mask)."""
  if not plan.causal:
    return 0
  return jax.lax.div(ki * plan.bk, plan.bq)


def dot_nt(a, b, precision) -> jax.Array:
  """a [m, D] . b [n, D]^T -> [m, n] float32."""
  return jax.lax.dot_general(
    a, b, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
  )


def dot_nn(a, b, precision) -> jax.Array:
  """a [m, k] . b [k, n] -> [m, n] float32."""
  return jax.lax.dot_general(
    a, b, (((1,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
  )


def precision_for(dtype):
  """Full float32 products for float32 inputs (asked of Mosaic explicitly); the MXU's native
  products for bfloat16 ones."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


# Per kernel: (matmuls per visible score, exps per visible score).
_SCORE_WORK = {"forward": (2, 1), "dq": (3, 1), "dkv": (4, 1)}


def cost(plan: Plan, kind: str, q_shape, S: int, K: int, args, out_shape) -> pl.CostEstimate:
  """pl.CostEstimate of one pallas_call, kind "forward", "dq" or "dkv" (the formula is in
  rove_jax.kernels.fused's docstring):
    bytes_accessed: every input and output array once;
    flops: 2 * D per product of each [.., D] matmul over the scores of the block pairs that
      run (forward: q.k, p.v; dq: q.k, dO.v, ds.k; dkv: k.q, p.dO, v.dO, ds.q), plus 6 * D
      per rotated row and 3 * D per row of rotation tables;
    transcendentals: one exp per score, cos and sin per table entry (2 * D a row).
  """
  B, H, T, D = q_shape
  nq, nk = T // plan.bq, S // plan.bk
  pairs = sum(
    1
    for i in range(nq)
    for j in range(nk)
    if not plan.causal or j * plan.bk <= i * plan.bq + plan.bq - 1
  )
  scores = B * H * pairs * plan.bq * plan.bk
  matmuls, exps = _SCORE_WORK[kind]
  kv_per_step = K * plan.bk * (2 if plan.rotate_values else 1)
  q_per_step = H * plan.bq * (2 if plan.rotate_output else 1)
  if kind == "forward":  # k (v) every step; q once a block, the output back (RoVE)
    rotated = B * pairs * kv_per_step + B * T * H * (2 if plan.rotate_output else 1)
    table_rows = B * pairs * plan.bk + B * T * (2 if plan.rotate_output else 1)
  elif kind == "dq":  # k (v) every step; q, dO (RoVE) and dq once a block
    rotated = B * pairs * kv_per_step + B * T * H * (3 if plan.rotate_output else 2)
    table_rows = B * pairs * plan.bk + 2 * B * T
  else:  # q, dO (RoVE) every step; k, v and dk, dv once a block
    rotated = B * pairs * q_per_step + 2 * B * S * K * (2 if plan.rotate_values else 1)
    table_rows = B * pairs * plan.bq + 2 * B * S
  size = lambda a: math.prod(a.shape) * jnp.dtype(a.dtype).itemsize
  arrays = [a for a in jax.tree.leaves(args) + jax.tree.leaves(out_shape) if a is not None]
  return pl.CostEstimate(
    flops=int(matmuls * 2 * D * scores + 6 * D * rotated + 3 * D * table_rows),
    transcendentals=int(exps * scores + 2 * D * table_rows),
    bytes_accessed=int(sum(size(a) for a in arrays)),
  )
