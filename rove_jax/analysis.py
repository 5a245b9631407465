"""Analysis of the value path: RoVE's value kernels and the layer's token-mixing matrix.

Matrices here act on column vectors (math convention): w_v is [D, E] and maps an input token
x_j in R^E to its value v_j = w_v x_j in R^D. (A Flax Dense kernel is the transpose, [E, D].)

  value kernel     psi_delta = R_delta w_v                                   [D, E]
  mixer (RoPE)     M = A (x) w_v            block (i, j) = A_ij w_v            [T*D, S*E]
  mixer (RoVE)     block (i, j) = A_ij R_{p_j - p_i} w_v = A_ij psi_{p_j - p_i}

so y = M x stacks the layer's outputs y_i = sum_j block(i, j) x_j. RoVE's mixer is block
Toeplitz up to the attention weights A: block (i, j) / A_ij depends only on p_j - p_i.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rove_jax import rotary


def value_kernel(delta, w_v, inv_freq: rotary.Frequencies, *,
                 layout: str = "interleaved") -> jax.Array:
  """psi_delta = R_delta w_v, RoVE's value kernel at relative offset delta = p_j - p_i.

  Args:
    delta: a scalar offset, or an array [N] of offsets (multi-axis: [A] or [N, A]).
    w_v: [D, E] value projection (column-vector convention).
    inv_freq: frequency table [P] with 2P <= D (or a sequence of per-axis tables).

  Returns:
    [D, E] for a scalar delta, [N, D, E] for N offsets.
  """
  w_v = jnp.asarray(w_v)
  if w_v.ndim != 2:
    raise ValueError(f"w_v must be a [D, E] matrix, got shape {w_v.shape}")
  dim = w_v.shape[0]
  delta = jnp.asarray(delta, jnp.float32)
  single = delta.ndim == (1 if rotary.is_multi_axis(inv_freq) else 0)
  deltas = delta[None] if single else delta
  mats = jax.vmap(lambda d: rotary.rotation_matrix(d, inv_freq, dim, layout=layout))(deltas)
  psi = jnp.einsum("nde,ec->ndc", mats, w_v.astype(jnp.float32))
  return psi[0] if single else psi


def mixer_matrix(weights_TS, w_v, q_positions, kv_positions, inv_freq: rotary.Frequencies, *,
                 rove: bool, layout: str = "interleaved") -> jax.Array:
  """The dense token-mixing matrix of one attention head, [T*D, S*E].

  Args:
    weights_TS: attention weights A [T, S] (rows of a softmax, or any matrix).
    w_v: [D, E] value projection.
    q_positions: [T] query positions (multi-axis: [T, A]).
    kv_positions: [S] key/value positions.
    inv_freq: frequency table.
    rove: True for RoVE's block (i, j) = A_ij R_{p_j - p_i} w_v, False for RoPE's A (x) w_v.

  Returns:
    M with y_flat = M @ x_flat, where x_flat stacks the S inputs [E] and y_flat the T outputs.
  """
  a_TS = jnp.asarray(weights_TS, jnp.float32)
  w_v = jnp.asarray(w_v, jnp.float32)
  T, S = a_TS.shape
  D, E = w_v.shape
  if not rove:
    return jnp.kron(a_TS, w_v)
  q_pos = jnp.asarray(q_positions, jnp.float32)
  kv_pos = jnp.asarray(kv_positions, jnp.float32)
  if q_pos.shape[0] != T or kv_pos.shape[0] != S:
    raise ValueError(f"positions {q_pos.shape}, {kv_pos.shape} do not match weights [T, S] = "
                     f"{(T, S)}")
  delta_TS = kv_pos[None, :] - q_pos[:, None] if q_pos.ndim == 1 else (
      kv_pos[None, :, :] - q_pos[:, None, :])
  flat = delta_TS.reshape((T * S,) + delta_TS.shape[2:])
  psi = value_kernel(flat, w_v, inv_freq, layout=layout).reshape(T, S, D, E)
  blocks_TSDC = a_TS[:, :, None, None] * psi
  return jnp.transpose(blocks_TSDC, (0, 2, 1, 3)).reshape(T * D, S * E)
