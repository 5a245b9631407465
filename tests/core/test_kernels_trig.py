"""rove_jax.kernels.trig: the GPU kernels' own sin and cos against float64."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rove_jax.kernels import trig


def angles(hi):
  """float32 angles up to hi radians, negative ones and exact multiples of pi / 4 included."""
  rng = np.random.default_rng(0)
  a = [rng.uniform(-h, h, 20000) for h in (4.0, 1e3, hi)] + [np.arange(-64, 64) * np.pi / 4]
  return np.concatenate(a).astype(np.float32)


def error(sin, cos, a):
  a64 = a.astype(np.float64)
  sin, cos = (np.asarray(x, np.float64) for x in (sin, cos))
  return max(np.abs(sin - np.sin(a64)).max(), np.abs(cos - np.cos(a64)).max())


@pytest.mark.parametrize("hardware,hi", [(False, 1.6e6), (True, 4e5)])
def test_sincos_is_accurate_to_a_large_angle(hardware, hi):
  """The kernels' shared sin/cos reduction, within 2e-7 of float64 sin and cos of the same
  float32 angles. hardware=True reduces by whole turns for the GPU's sin.approx and cos.approx;
  here (a multiply and an add, each rounded: no fused multiply-add) up to 4e5 radians, and
  jnp.sin and jnp.cos of the reduced angle are exact, so this checks that reduction."""
  a = angles(hi)
  assert error(*trig.sincos(jnp.asarray(a), hardware=hardware), a) < 2e-7


def gpu_multiply_add(x, y, z):
  """x * y + z rounded once to float32, as the GPU's FFMA: float32 operands multiply exactly in
  float64 (48 bits), and the sum here is near enough to exact for one float32 rounding."""
  exact = np.asarray(x, np.float64) * np.float64(y) + np.asarray(z, np.float64)
  return jnp.asarray(exact.astype(np.float32))


def test_whole_turns_with_fused_multiply_adds_stay_accurate_to_6e6_radians():
  """trig.turns as the GPU runs it (each step one FFMA): its reduced angle gives sin and cos
  within 2e-7 up to 1.6e6 radians and 4e-7 up to 6.5e6 (k = 2**20 turns), past the 4e5 where
  the unfused arithmetic above stays exact."""
  for hi, tol in ((1.6e6, 2e-7), (6.5e6, 4e-7)):
    a = angles(hi)
    r = np.asarray(trig.turns(jnp.asarray(a), gpu_multiply_add), np.float64)
    assert np.abs(r).max() < math.pi + 0.5
    assert error(np.sin(r), np.cos(r), a) < tol, hi
