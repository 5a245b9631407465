"""Analysis of the value path: RoVE's value kernels and the layer's token-mixing matrix.

Matrices here act on column vectors (math convention): w_v is [D, E] and maps an input token
x_j in R^E to its value v_j = w_v x_j in R^D. (A Flax Dense kernel is the transpose, [E, D].)

  value kernel     psi_delta = R_delta w_v                                   [D, E]
  mixer (RoPE)     M = A (x) w_v            block (i, j) = A_ij w_v            [T*D, S*E]
  mixer (RoVE)     block (i, j) = A_ij R_{p_j - p_i} w_v = A_ij psi_{p_j - p_i}

so y = M x stacks the layer's outputs y_i = sum_j block(i, j) x_j. RoVE's mixer is block
Toeplitz up to the attention weights A: block (i, j) / A_ij depends only on p_j - p_i.

`layer_attention` reads A, w_v and the frequencies of one head out of a trained GPT, and
`figure1_mixers` turns them into the two mixers of the paper's Figure 1 (drawn by
rove_jax.evaluation.plots.figure1).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from rove_jax import rotary


def value_kernel(
  delta, w_v, inv_freq: rotary.Frequencies, *, layout: str = "interleaved"
) -> jax.Array:
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


def mixer_matrix(
  weights_TS,
  w_v,
  q_positions,
  kv_positions,
  inv_freq: rotary.Frequencies,
  *,
  rove: bool,
  layout: str = "interleaved",
) -> jax.Array:
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
    raise ValueError(
      f"positions {q_pos.shape}, {kv_pos.shape} do not match weights [T, S] = {(T, S)}"
    )
  delta_TS = (
    kv_pos[None, :] - q_pos[:, None]
    if q_pos.ndim == 1
    else (kv_pos[None, :, :] - q_pos[:, None, :])
  )
  flat = delta_TS.reshape((T * S,) + delta_TS.shape[2:])
  psi = value_kernel(flat, w_v, inv_freq, layout=layout).reshape(T, S, D, E)
  blocks_TSDC = a_TS[:, :, None, None] * psi
  return jnp.transpose(blocks_TSDC, (0, 2, 1, 3)).reshape(T * D, S * E)


def layer_attention(model, tokens_T, *, layer: int = 0, head: int = 0) -> dict:
  """What one head of a model does to a token sequence, read through the model's own code.

  The attention probabilities come from `Attention.weights` (the model's projections, rotary
  frequencies after the config's rope_scaling, attention factor, layout, T5 bias and mask),
  the value matrix from `Attention.value_projection`.

  Args:
    model: a rove_jax GPT.
    tokens_T: [T] token ids (positions 0..T-1).
    layer, head: which attention head.

  Returns:
    {"a": A [T, T] probabilities, "w_v": [D, E] value matrix (column-vector convention of
    rove_jax.analysis), "b_v": [D] or None, "x": [T, E] the layer's attention input,
    "inv_freq": [P] the frequencies the layer rotates with (for a non-rotary model, plain
    RoPE's of the whole head, to show what RoVE would do), "layout": the rotary layout}.
  """
  cfg = model.config
  tokens = jnp.asarray(tokens_T, jnp.int32)[None]
  pos = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  block = model.blocks[layer]
  x_BTE = block.norm1(model.embed_tokens(tokens, pos))
  ctx = model.context(pos)
  a_BHTS = block.attn.weights(x_BTE, ctx)
  w_EKD, b_KD = block.attn.value_projection()
  kv_head = head // (cfg.n_head // cfg.n_kv_head)
  inv_freq = (
    ctx.inv_freq
    if ctx.inv_freq is not None
    else rotary.rope_frequencies(cfg.head_dim, base=cfg.rope_base)
  )
  return {
    "a": np.asarray(a_BHTS[0, head], np.float32),
    "w_v": np.asarray(w_EKD[:, kv_head].T, np.float32),
    "b_v": None if b_KD is None else np.asarray(b_KD[kv_head], np.float32),
    "x": np.asarray(x_BTE[0], np.float32),
    "inv_freq": np.asarray(inv_freq),
    "layout": cfg.rope_layout,
  }


def figure1_mixers(
  head_view: dict, *, pairs: Optional[int] = None, features: Optional[int] = None
) -> dict:
  """RoPE's mixer A (x) W_V and RoVE's [A_ij R_{j-i} W_V] for a `layer_attention` result.

  Args:
    head_view: the dict `layer_attention` returns.
    pairs: show only the head dims of the first (fastest-turning) `pairs` rotary pairs, taken
      whole in the model's layout (so each shown dim keeps its rotation partner); None: all D.
    features: show only the first `features` input features; None: all E.

  Returns:
    {"rope", "rove": [T * d, T * e] mixers, "dims": the d head dims shown}. With pairs and
    features None, y = mixer @ x.ravel() is the head's attention output (before the output
    projection; value bias aside) as [T, D] raveled.
  """
  a, w_v, inv = head_view["a"], head_view["w_v"], head_view["inv_freq"]
  n_pairs = len(inv)
  if pairs is None:
    dims = np.arange(w_v.shape[0])
  else:
    inv = inv[: min(pairs, n_pairs)]
    k = len(inv)
    dims = (
      np.arange(2 * k)
      if head_view["layout"] == "interleaved"
      else np.concatenate([np.arange(k), n_pairs + np.arange(k)])
    )
  w_v = w_v[dims][:, :features]
  pos = np.arange(a.shape[0])
  mix = lambda rove: np.asarray(
    mixer_matrix(a, w_v, pos, pos, inv, rove=rove, layout=head_view["layout"])
  )
  return {"rope": mix(False), "rove": mix(True), "dims": dims}
