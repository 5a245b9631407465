"""What the GPU fused kernel's forward (rove_jax.kernels.fused_gpu) and backward
(rove_jax.kernels.fused_gpu_backward) bodies share: the pair swap, the rotation of a tile, its
tables from positions (sin and cos from rove_jax.kernels.trig), and the Triton compiler parameters.
Everything but `swap_matrix` runs inside a Pallas Triton kernel (or its interpret mode) on
[n, D] tiles in float32.

Shape letters: n rows of a tile (bq queries or bk keys), D head dim.

The rotation of a tile: with C = cos(pos * f) and S = -sin(pos * f) on the first member of each
pair, +sin(pos * f) on the second (0 on pass-through dims; fused_tiles' SA + SB),

    R x = x * C + swap(x) * S,   R^-1 x = x * C - swap(x) * S,

where swap(x)[d] = x[partner of d] is a product with a [D, D] 0/1 matrix on the tensor cores:
Triton has no lane rotation (pltpu.roll on TPU), and splitting a tile into its pair members
needs power-of-two halves, which partial rotary (e.g. 48 of 64 dims, "half" layout) does not
give. The product is exact: a bfloat16 tile is multiplied as is, a float32 one as the three
bfloat16 pieces whose sum it is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import triton as plgpu

from rove_jax.kernels import fused_tiles, trig
from rove_jax.kernels.fused_tiles import Plan

# Warps a program: the fewest that leave ptxas few or no register spills at the default blocks
# (bench.fused_gpu --aot h200 --ptxas reports them); speed on a GPU is unmeasured.
FORWARD_WARPS = 4
BACKWARD_WARPS = 8
NUM_STAGES = 2


def row_operands(q_BTHD, k_BSKD, v_BSKD, q_pos_BT, kv_pos_BS, q_seg, kv_seg) -> list:
  """The operands of the GPU kernels (Triton and Mosaic GPU): positions as float32 rows
  [B, 1, n], segment ids as int32 rows when given, then q, k, v."""
  B, T = q_BTHD.shape[:2]
  S = k_BSKD.shape[1]
  rows = lambda x, n: jnp.broadcast_to(x, (B, n)).reshape(B, 1, n)
  args = [rows(jnp.asarray(q_pos_BT, jnp.float32), T), rows(jnp.asarray(kv_pos_BS, jnp.float32), S)]
  if q_seg is not None:
    args += [rows(q_seg.astype(jnp.int32), T), rows(kv_seg.astype(jnp.int32), S)]
  return args + [q_BTHD, k_BSKD, v_BSKD]


def swap_matrix(D: int, offset: int, n_rotated: int) -> np.ndarray:
  """[D, D] 0/1: (x @ it)[d] = x[partner of d] for the rotated dims, x[d] for pass-through ones
  (whose rotation coefficients are 0, so any value would do). offset: the distance between
  the members of a pair (1 interleaved, P half)."""
  d = np.arange(D)
  if offset == 1:
    partner = d ^ 1
  else:
    partner = np.where(d < offset, d + offset, d - offset)
  partner = np.where(d < n_rotated, partner, d)
  m = np.zeros((D, D), np.float32)
  m[partner, d] = 1.0
  return m


def pair_swap(x_nD, swap_DD) -> jax.Array:
  """x @ swap (`swap_matrix`) in float32, exactly: a bfloat16 tile in one product, another as
  the three bfloat16 pieces of its float32 value (24 bits of mantissa in 3 x 8)."""
  if x_nD.dtype == jnp.bfloat16:
    return fused_tiles.dot_nn(x_nD, swap_DD, None)
  x = x_nD.astype(jnp.float32)
  out, rest = None, x
  for _ in range(3):
    piece = rest.astype(jnp.bfloat16)
    rest = rest - piece.astype(jnp.float32)
    part = fused_tiles.dot_nn(piece, swap_DD, None)
    out = part if out is None else out + part
  return out


def rotate(x_nD, tabs, swap_ref, *, inverse: bool = False) -> jax.Array:
  """R x (R^-1 x when inverse) of a tile [n, D] (any float dtype) in float32, with `tables`'
  tables. The swap matrix is read from its ref at each use, not held across loops (registers
  are what a Triton program runs short of)."""
  c_nD, s_nD = tabs
  turn = pair_swap(x_nD, swap_ref[...]) * s_nD
  x = x_nD.astype(jnp.float32)
  return x * c_nD - turn if inverse else x * c_nD + turn


def tables(pos_ref, consts_ref, rows=None):
  """(C, S), each [n, D] float32, for the positions pos_ref[rows] (all of the ref when rows is
  None): C = cos(pos * f) and S = SA + SB of fused_tiles.tables (-sin on first members, +sin
  on second ones, 0 on pass-through dims)."""
  pos_n1 = (pos_ref[...] if rows is None else pos_ref[rows])[:, None]
  angle_nD = pos_n1 * consts_ref[fused_tiles.FREQ : fused_tiles.FREQ + 1, :]
  sign_1D = (
    consts_ref[fused_tiles.NEG_FIRST : fused_tiles.NEG_FIRST + 1, :]
    + consts_ref[fused_tiles.SECOND : fused_tiles.SECOND + 1, :]
  )
  sin_nD, cos_nD = trig.sincos(angle_nD)
  return cos_nD, sin_nD * sign_1D


def compiler_params(backward: bool = False):
  return plgpu.CompilerParams(
    num_warps=BACKWARD_WARPS if backward else FORWARD_WARPS, num_stages=NUM_STAGES
  )


def kernel_name(plan: Plan, part: str) -> str:
  """The name of one pallas_call (and of its GPU kernel): part and kind, e.g.
  fused_rotary_attention_gpu_fwd_rove."""
  kind = "rope" if not plan.rotate_values else "rove" if plan.rotate_output else "rove_rotated"
  return f"fused_rotary_attention_gpu_{part}_{kind}"
