"""rove_jax.kernels.trig: the GPU kernels' own sin and cos against float64."""

import jax.numpy as jnp
import numpy as np
import pytest

from rove_jax.kernels import trig


@pytest.mark.parametrize("hardware", [False, True])
def test_sincos_is_accurate_to_1e6_radians(hardware):
  """The kernel's shared sin/cos reduction: within 2e-7 of float64 sin and cos of the same
  float32 angles, negative ones and exact multiples of pi / 4 included, up to 1.6e6 radians.
  hardware=True reduces by whole turns for the GPU's sin.approx and cos.approx; here jnp.sin
  and jnp.cos of the reduced angle are exact, so this checks that reduction."""
  rng = np.random.default_rng(0)
  a = np.concatenate(
    [rng.uniform(-hi, hi, 20000) for hi in (4.0, 1e3, 1.6e6)] + [np.arange(-64, 64) * np.pi / 4]
  ).astype(np.float32)
  sin, cos = (np.asarray(x, np.float64) for x in trig.sincos(jnp.asarray(a), hardware=hardware))
  a64 = a.astype(np.float64)
  assert np.abs(sin - np.sin(a64)).max() < 2e-7
  assert np.abs(cos - np.cos(a64)).max() < 2e-7
