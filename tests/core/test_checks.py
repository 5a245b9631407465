"""rove_jax.checks: what the input checks count as an int and as a finite number."""

import math

import numpy as np
import pytest

from rove_jax import checks

INTS = [0, -3, 2**40, np.int32(5), np.int64(-1), np.uint8(7)]
FLOATS = [0.5, -1e300, np.float32(2.5), np.float64(3.0)]
NOT_NUMBERS = [True, False, np.bool_(True), None, "3", b"3", [3], (3,), 3 + 0j, object()]
NOT_FINITE = [math.inf, -math.inf, math.nan, np.float32("nan"), np.float64("inf")]


@pytest.mark.parametrize("value", INTS)
def test_ints_are_ints_and_finite(value):
  assert checks.is_int(value)
  assert checks.is_finite(value)


@pytest.mark.parametrize("value", FLOATS + NOT_FINITE)
def test_floats_are_not_ints(value):
  assert not checks.is_int(value)


@pytest.mark.parametrize("value", FLOATS)
def test_finite_floats(value):
  assert checks.is_finite(value)


@pytest.mark.parametrize("value", NOT_FINITE + NOT_NUMBERS)
def test_infinities_nans_bools_and_non_numbers_are_not_finite_numbers(value):
  assert not checks.is_finite(value)
  assert not checks.is_finite(value, numpy=False)
  assert not checks.is_int(value)
  assert not checks.is_int(value, numpy=False)


def test_numpy_false_takes_what_json_writes():
  """numpy.float64 subclasses float (json writes it); the other NumPy scalars are refused."""
  assert checks.is_int(3, numpy=False) and checks.is_finite(3, numpy=False)
  assert checks.is_finite(0.25, numpy=False)
  assert checks.is_finite(np.float64(0.25), numpy=False)
  for value in (np.int64(3), np.int32(3), np.float32(0.25)):
    assert not checks.is_finite(value, numpy=False), value
  assert not checks.is_int(np.int64(3), numpy=False)
