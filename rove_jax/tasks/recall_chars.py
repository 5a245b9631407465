"""The recall source's alphabets and their token ids (the byte tokenizer maps each ASCII
character to its code), shared by the generators of rove_jax.tasks.recall (MQAR, the spec) and
rove_jax.tasks.recall_tasks (the position-dependent tasks).

  keys     '0'..'9' (the offset task's query digits are '1'..'9')
  records  'A'..'Z', 'a'..'z': record (k, v) is RECORD_CHARS[k * values + v]
  filler   '!'..'*' (ten punctuation characters)
  marker   '@' (the offset task), outside the three alphabets above
"""

from __future__ import annotations

import string

import numpy as np

KEY_CHARS = string.digits
RECORD_CHARS = string.ascii_uppercase + string.ascii_lowercase
FILLER_CHARS = string.punctuation[:10]
MARKER = "@"


def char_ids(chars: str) -> np.ndarray:
  """The token ids of ASCII characters under the byte tokenizer: their codes [len(chars)]."""
  return np.frombuffer(chars.encode("ascii"), np.uint8).astype(np.int32)


def filler_ids() -> np.ndarray:
  return char_ids(FILLER_CHARS)


def key_ids(spec) -> np.ndarray:
  """The key token ids [spec.keys]."""
  return char_ids(KEY_CHARS[: spec.keys])


def record_ids(spec) -> np.ndarray:
  """The record token ids [keys, values]: record (k, v) holds key k and value v."""
  return char_ids(RECORD_CHARS[: spec.keys * spec.values]).reshape(spec.keys, spec.values)
