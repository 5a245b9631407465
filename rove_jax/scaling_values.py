"""The keys of a transformers rope dict and how rove_jax.scaling reads each value: numbers,
lists of numbers, the training context length and flags, each checked with a message naming
the key."""

from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np

from rove_jax import checks

# Every key a spec reads, in the order to_dict and repr write them.
KEYS = (
  "rope_type",
  "factor",
  "original_max_position_embeddings",
  "rope_theta",
  "partial_rotary_factor",
  "beta_fast",
  "beta_slow",
  "truncate",
  "attention_factor",
  "mscale",
  "mscale_all_dim",
  "low_freq_factor",
  "high_freq_factor",
  "short_factor",
  "long_factor",
)
# Read by every type: transformers v5 keeps rope_theta and partial_rotary_factor in the dict.
COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def as_float(name: str, value) -> Optional[float]:
  if value is None:
    return None
  if isinstance(value, (bool, np.bool_)) or not isinstance(
    value, (int, float, np.integer, np.floating)
  ):
    raise ValueError(
      f"rope_scaling[{name!r}] must be a number, got {type(value).__name__}: {value!r}"
    )
  if not math.isfinite(value):
    raise ValueError(f"rope_scaling[{name!r}] must be a finite number, got {value!r}")
  return float(value)


def as_floats(name: str, value) -> Optional[tuple]:
  if value is None:
    return None
  if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
    raise ValueError(
      f"rope_scaling[{name!r}] must be a list of numbers, got {type(value).__name__}: {value!r}"
    )
  return tuple(as_float(f"{name}[{i}]", x) for i, x in enumerate(value))


def as_length(name: str, value) -> Optional[int]:
  if value is None:
    return None
  ok = checks.is_finite(value) and value == int(value) and value > 0
  if not ok:
    raise ValueError(
      f"rope_scaling[{name!r}] must be a positive int (the training context), got "
      f"{type(value).__name__}: {value!r}"
    )
  return int(value)


def as_bool(name: str, value) -> Optional[bool]:
  if value is None:
    return None
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(
      f"rope_scaling[{name!r}] must be true or false, got {type(value).__name__}: {value!r}"
    )
  return bool(value)


# How each key's value is read; any other key is a float.
CONVERT = {
  "original_max_position_embeddings": as_length,
  "truncate": as_bool,
  "short_factor": as_floats,
  "long_factor": as_floats,
}
