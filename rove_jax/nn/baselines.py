"""The non-rotary positional encodings the paper compares RoVE against, as pure functions.

  learned      a trained table [max_len, E] added to the token embeddings (GPT-2)
  sinusoidal   fixed sin/cos features added to the token embeddings (Vaswani et al. 2017)
  t5_bias      a trained logit bias per head and relative-distance bucket (Raffel et al. 2020)

The GPT in rove_jax.nn.model holds their parameters and calls these functions.

Shape letters (legend in rove_jax): B batch, T query tokens, S key/value tokens, H query
heads, E model width, U T5 buckets.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def learned_embedding(pos_table, positions_BT) -> jax.Array:
  """Rows of a learned position table [max_len, E]: [B, T, E] (positions < max_len)."""
  return pos_table[positions_BT]


def sinusoidal_embedding(positions, dim: int) -> jax.Array:
  """Fixed position features: sin(p / 10000^(2i/dim)) at dim 2i and cos at 2i + 1.

  Args:
    positions: int or float positions of any shape [...].
    dim: even feature width.

  Returns:
    [..., dim] float32.
  """
  inv = jnp.asarray(10000.0 ** -(np.arange(0, dim, 2) / dim), jnp.float32)
  angle = positions.astype(jnp.float32)[..., None] * inv.reshape((1,) * positions.ndim + inv.shape)
  return jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1).reshape(positions.shape + (dim,))


def t5_buckets(distance, num_buckets: int, max_distance: int) -> jax.Array:
  """T5's causal relative-position buckets.

  Distances below num_buckets / 2 get a bucket each; larger ones share logarithmically wider
  buckets up to max_distance, and everything beyond falls in the last bucket.

  Args:
    distance: int array, q_pos - kv_pos (>= 0 is the past; the future maps to bucket 0).
    num_buckets: U.
    max_distance: where the logarithmic buckets end.

  Returns:
    int32 buckets in [0, U), the shape of `distance`.
  """
  n = jnp.maximum(distance, 0)
  exact = num_buckets // 2
  log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / exact) / math.log(
    max_distance / exact
  )
  large = exact + (log_ratio * (num_buckets - exact)).astype(jnp.int32)
  return jnp.where(n < exact, n, jnp.minimum(large, num_buckets - 1))


def t5_bias(
  table_UH, q_positions_BT, kv_positions_BS, *, num_buckets: int, max_distance: int
) -> jax.Array:
  """The T5 logit bias of every (query, key) pair: table[bucket(q_pos - kv_pos)].

  Args:
    table_UH: [U, H] learned bias per bucket and head.
    q_positions_BT: [B, T] query positions.
    kv_positions_BS: [B, S] key positions.
    num_buckets, max_distance: as in `t5_buckets`.

  Returns:
    [B, H, T, S] in the table's dtype, the layout `attention.masked_attention`'s bias_fn returns.
  """
  distance_BTS = q_positions_BT[:, :, None] - kv_positions_BS[:, None, :]
  buckets_BTS = t5_buckets(distance_BTS, num_buckets, max_distance)
  return jnp.moveaxis(table_UH[buckets_BTS], -1, 1)


def check_learned_positions(max_len: int, length: int, positions_BT=None) -> None:
  """Raises ValueError when a learned table of `max_len` rows cannot embed the input: a
  sequence longer than the table, or (when known before tracing) a position past it."""
  if length > max_len:
    raise ValueError(
      f"learned position embeddings cover {max_len} positions; got a sequence "
      f"of {length} tokens. Use a rotary, sinusoidal, t5_bias or nope model for "
      f"longer inputs."
    )
  if positions_BT is not None and not isinstance(positions_BT, jax.core.Tracer):
    top = int(np.max(np.asarray(positions_BT)))
    if top >= max_len:
      raise ValueError(
        f"learned position embeddings cover positions 0..{max_len - 1}; got position {top}"
      )
