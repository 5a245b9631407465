"""The non-rotary encodings against hand-computed numbers."""

import math

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from rove_jax.nn import baselines
from tests import reference as ref

# (distance, bucket) for 32 buckets up to distance 128: 16 exact buckets, then
# 16 + int(ln(d / 16) / ln(8) * 16), capped at 31; the future (d < 0) is bucket 0.
T5_BY_HAND = [
  (-5, 0),
  (0, 0),
  (1, 1),
  (15, 15),
  (16, 16),
  (20, 17),
  (32, 21),
  (64, 26),
  (100, 30),
  (127, 31),
  (128, 31),
  (1000, 31),
]


def test_t5_buckets_by_hand():
  d, want = (np.array(c) for c in zip(*T5_BY_HAND))
  got = baselines.t5_buckets(jnp.asarray(d), 32, 128)
  chex.assert_trees_all_equal(got, jnp.asarray(want, jnp.int32))
  assert [ref.t5_bucket(x, 32, 128) for x in d] == list(want)  # the reference agrees
  # every distance up to far past max_distance, against the float64 reference
  d = np.arange(-3, 400)
  np.testing.assert_array_equal(
    baselines.t5_buckets(jnp.asarray(d), 32, 128), [ref.t5_bucket(x, 32, 128) for x in d]
  )


def test_t5_bias_reads_the_table_per_head_and_bucket():
  table = jnp.arange(8 * 2, dtype=jnp.float32).reshape(8, 2)  # [N, H]: entry = 2 * bucket + h
  q_pos, kv_pos = jnp.array([[5, 6]]), jnp.array([[0, 3, 6]])
  bias = baselines.t5_bias(table, q_pos, kv_pos, num_buckets=8, max_distance=16)
  chex.assert_shape(bias, (1, 2, 2, 3))
  buckets = np.array([[ref.t5_bucket(i - j, 8, 16) for j in (0, 3, 6)] for i in (5, 6)])
  # 4 exact buckets; d = 5 -> 4 + int(ln(5/4) / ln(4) * 4) = 4, d = 6 -> 4 + int(1.17) = 5
  np.testing.assert_array_equal(buckets, [[4, 2, 0], [5, 3, 0]])
  for h in range(2):
    np.testing.assert_array_equal(bias[0, h], 2 * buckets + h)


def test_sinusoidal_by_hand():
  got = baselines.sinusoidal_embedding(jnp.array([[0, 1, 2]]), 4)
  chex.assert_shape(got, (1, 3, 4))
  # dim 4: wavelengths 1 and 10000^(2/4) = 100
  want = [
    [0.0, 1.0, 0.0, 1.0],
    [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
    [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
  ]
  chex.assert_trees_all_close(got[0], jnp.asarray(want), atol=1e-6, rtol=0)
  pos = np.arange(50)
  chex.assert_trees_all_close(
    baselines.sinusoidal_embedding(jnp.asarray(pos), 16),
    np.stack([ref.sinusoid(p, 16) for p in pos]),
    atol=2e-5,
    rtol=0,
  )


def test_learned_positions_checked_before_tracing():
  table = jnp.arange(12.0).reshape(4, 3)
  chex.assert_trees_all_equal(
    baselines.learned_embedding(table, jnp.array([[2, 0]])), table[jnp.array([[2, 0]])]
  )
  baselines.check_learned_positions(4, 4, np.array([[0, 1, 2, 3]]))
  with pytest.raises(ValueError, match="cover 4 positions; got a sequence of 5"):
    baselines.check_learned_positions(4, 5)
  with pytest.raises(ValueError, match="got position 4"):
    baselines.check_learned_positions(4, 2, np.array([[3, 4]]))
