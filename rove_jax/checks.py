"""What the input checks across the package count as an int and as a finite number.

bool is never a number here (True would pass as 1). NumPy scalars are numbers unless
`numpy=False`: a value that goes into a JSON file as it is (a RunConfig's fields) must be a
Python int or float, as json cannot write a numpy.int64 or numpy.float32.
"""

from __future__ import annotations

import math

import numpy as np

_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def is_int(value, *, numpy: bool = True) -> bool:
  """An int (a NumPy integer too unless numpy=False), not a bool."""
  return isinstance(value, _INTS if numpy else int) and not isinstance(value, (bool, np.bool_))


def is_finite(value, *, numpy: bool = True) -> bool:
  """An int or a float that is neither infinite nor NaN (NumPy scalars too unless numpy=False),
  not a bool."""
  return (
    isinstance(value, _REALS if numpy else (int, float))
    and not isinstance(value, (bool, np.bool_))
    and math.isfinite(value)
  )
