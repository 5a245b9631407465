"""RoPE and RoVE attention in one self-contained file: copy it into a project that has jax.

Shape letters: B batch, T queries, S keys/values, H query heads, K key/value heads (H % K == 0,
GQA/MQA), D head dim, P = D / 2 rotary pairs.

  RoPE:  y_i = sum_j A_ij v_j,          A_ij = softmax_j((R_i q_i).(R_j k_j) / sqrt(D))
  RoVE:  y_i = R_i^-1 sum_j A_ij R_j v_j = sum_j A_ij R_{j-i} v_j

R_t turns pair m of a head vector, (x[2m], x[2m+1]) (the interleaved layout of RoFormer and
GPT-J), by the angle t * theta_m, theta_m = base^(-2m / D). Key j is visible to query i iff its
position is not later (kv_positions[j] <= q_positions[i]), so the same call serves training,
packed positions that restart and queries after a cache of keys. A query that sees no key gets
zeros. rove_jax.attention is the full version: partial and multi-axis rotary, the "half"
layout, YaRN's attention factor, packed segments, KV caches, sliding windows and flash kernels.

  inv_freq = rope_frequencies(D)
  y = rove_attention(q, k, v, q_positions=pos, kv_positions=pos, inv_freq=inv_freq)
"""

import math

import jax
import jax.numpy as jnp


def rope_frequencies(head_dim: int, base: float = 10000.0) -> jax.Array:
  """theta_m = base^(-2m / head_dim) for m < head_dim / 2, float32 [P] (computed in float64)."""
  if head_dim <= 0 or head_dim % 2:
    raise ValueError(f"head_dim must be a positive even number, got {head_dim}")
  return jnp.asarray([base ** (-2 * m / head_dim) for m in range(head_dim // 2)], jnp.float32)


def rotate(x, positions, inv_freq, *, inverse: bool = False) -> jax.Array:
  """R_t x (R_t^-1 x if inverse) for x [B, T, H, D] at positions [B, T]; in x.dtype, computed
  in float32."""
  angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq[None, None, :]  # [B, T, P]
  cos = jnp.cos(angles)[:, :, None, :]  # [B, T, 1, P]: the same angle for every head
  sin = jnp.sin(angles)[:, :, None, :]
  if inverse:
    sin = -sin
  x32 = x.astype(jnp.float32)
  a, b = x32[..., 0::2], x32[..., 1::2]  # the two members of every pair, [B, T, H, P]
  turned = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)  # [B, T, H, P, 2]
  return turned.reshape(x.shape).astype(x.dtype)


def causal_attention(q, k, v, q_positions, kv_positions) -> jax.Array:
  """softmax(q.k / sqrt(D)) v over keys at positions <= the query's; GQA; [B, T, H, D]."""
  visible_BTS = kv_positions[:, None, :] <= q_positions[:, :, None]
  out = jax.nn.dot_product_attention(
    q, k, v, mask=visible_BTS[:, None], scale=1.0 / math.sqrt(q.shape[-1])
  )
  has_key = jnp.any(visible_BTS, axis=-1)[:, :, None, None]
  return jnp.where(has_key, out, jnp.zeros((), out.dtype))


def rope_attention(q, k, v, *, q_positions, kv_positions, inv_freq) -> jax.Array:
  """RoPE attention. q [B, T, H, D], k and v [B, S, K, D], positions [B, T] and [B, S],
  inv_freq [D / 2] (`rope_frequencies`). Returns [B, T, H, D] in q.dtype."""
  q_positions, kv_positions = jnp.asarray(q_positions), jnp.asarray(kv_positions)
  q_r = rotate(q, q_positions, inv_freq)
  k_r = rotate(k, kv_positions, inv_freq)
  return causal_attention(q_r, k_r, v, q_positions, kv_positions)


def rove_attention(q, k, v, *, q_positions, kv_positions, inv_freq) -> jax.Array:
  """RoVE attention: RoPE attention over values rotated by R_j, output rotated by R_i^-1.
  Same arguments as `rope_attention`."""
  q_positions, kv_positions = jnp.asarray(q_positions), jnp.asarray(kv_positions)
  q_r = rotate(q, q_positions, inv_freq)
  k_r = rotate(k, kv_positions, inv_freq)
  v_r = rotate(v, kv_positions, inv_freq)
  out = causal_attention(q_r, k_r, v_r, q_positions, kv_positions)
  return rotate(out, q_positions, inv_freq, inverse=True)
