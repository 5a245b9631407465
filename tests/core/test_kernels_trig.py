"""rove_jax.kernels.trig: the GPU kernels' own sin and cos against float64."""

import jax.numpy as jnp
import numpy as np

from rove_jax.kernels import trig


def test_sincos_is_accurate_to_1e6_radians():
  """The kernel's shared sin/cos reduction: within 2e-7 of float64 sin and cos of the same
  float32 angles, negative ones and exact multiples of pi / 4 included, up to 1.6e6 radians."""
  rng = np.random.default_rng(0)
  a = np.concatenate(
    [rng.uniform(-hi, hi, 20000) for hi in (4.0, 1e3, 1.6e6)] + [np.arange(-64, 64) * np.pi / 4]
  ).astype(np.float32)
  sin, cos = (np.asarray(x, np.float64) for x in trig.sincos(jnp.asarray(a)))
  a64 = a.astype(np.float64)
  assert np.abs(sin - np.sin(a64)).max() < 2e-7
  assert np.abs(cos - np.cos(a64)).max() < 2e-7
