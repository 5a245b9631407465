"""Checksums of a train state's arrays and of JSON records, for checkpoint integrity.

An array's checksum is a position-weighted sum of its bit patterns in uint32 arithmetic
(wrapping): sum_i bits_i * w_i with odd weights w_i = (i * 2654435761) | 1. Integer addition is
associative and commutative, so the value does not depend on how the array is sharded or on the
order XLA reduces in: a state checksummed on one mesh verifies on another. A single flipped bit
changes the sum by an odd multiple of a power of two below 2^32, so it is always detected; any
other damage escapes with probability about 2^-32. Arrays a process holds whole are summed on
the host in numpy; arrays sharded across processes where they live (one jitted reduction), and
only the uint32 values come back. Both paths compute the same integers. `verify` and
`verify_meta` check a restored checkpoint against the record its save wrote.

Shape letters (legend in rove_jax): N elements.
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

ALGORITHM = "u32-weighted-bit-sum-v1"  # recorded beside the values; a change of scheme is seen
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _bits_N(x) -> jax.Array:
  """The bit patterns of x as a flat uint32 vector (8-byte elements as two words)."""
  x = jnp.ravel(x)
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  size = jnp.dtype(x.dtype).itemsize
  if size == 8:
    return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
  if size not in _UINT:
    raise TypeError(f"no checksum for dtype {x.dtype}")
  return jax.lax.bitcast_convert_type(x, _UINT[size]).astype(jnp.uint32)


def _sum(x) -> jax.Array:
  bits_N = _bits_N(x)
  weights_N = jnp.arange(bits_N.shape[0], dtype=jnp.uint32) * jnp.uint32(2654435761) | jnp.uint32(1)
  return jnp.sum(bits_N * weights_N, dtype=jnp.uint32)


@jax.jit
def _sums(flat: dict) -> dict:
  return {name: _sum(x) for name, x in flat.items()}


def _host_sum(x: np.ndarray) -> int:
  """`_sum` in numpy, for arrays this process holds whole (no compile)."""
  x = np.ascontiguousarray(x).reshape(-1)
  if x.dtype == np.bool_:
    x = x.astype(np.uint8)
  size = x.dtype.itemsize
  if size == 8:
    bits_N = x.view(np.uint32)
  elif size in _UINT:
    bits_N = x.view(np.dtype(f"uint{8 * size}")).astype(np.uint32)
  else:
    raise TypeError(f"no checksum for dtype {x.dtype}")
  weights_N = np.arange(bits_N.shape[0], dtype=np.uint32) * np.uint32(2654435761) | np.uint32(1)
  return int(np.sum(bits_N * weights_N, dtype=np.uint32))


def _whole_here(x) -> bool:
  return not isinstance(x, jax.Array) or x.is_fully_addressable


def array_checksums(flat: dict) -> dict:
  """{entry name: 8 hex digits} of a flat {name: array} state (jax or numpy arrays).

  Arrays this process holds whole are summed on the host (numpy; no compile, and orbax copies
  them there to save anyway); arrays sharded across processes where they live (jitted), each
  process getting the same replicated values. Both paths compute the same integers."""
  if all(_whole_here(x) for x in flat.values()):
    sums = {name: _host_sum(np.asarray(x)) for name, x in flat.items()}
  else:
    # Each sum is replicated: any local copy holds it (also on one host of many).
    sums = {name: int(np.asarray(v.addressable_shards[0].data)) for name, v in _sums(flat).items()}
  return {name: f"{v:08x}" for name, v in sums.items()}


def json_checksum(record) -> str:
  """sha256 (16 hex digits) of a JSON-serialisable record in canonical form."""
  text = json.dumps(record, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def mismatches(expected: dict, actual: dict) -> list[str]:
  """Names whose checksums differ or are missing on either side, sorted."""
  return sorted(n for n in set(expected) | set(actual) if expected.get(n) != actual.get(n))


class CorruptCheckpoint(ValueError):
  """A checkpoint whose contents fail their recorded checksums (or hold non-finite values)."""


def verify(state: dict, meta: dict, data_state: Optional[dict] = None) -> bool:
  """Checks a restored flat state (and iterator state) against the checksums in its metadata.

  Returns:
    True (it raises otherwise).

  Raises:
    CorruptCheckpoint: naming the entries whose checksums differ, or metadata that carries
      none (every checkpoint is saved with them).
  """
  integrity = meta.get("integrity")
  if integrity is None:
    raise CorruptCheckpoint(
      "its metadata carries no checksums (every checkpoint is saved "
      "with them: the metadata was damaged or replaced)"
    )
  if integrity.get("algorithm") != ALGORITHM:
    raise CorruptCheckpoint(f"unknown checksum algorithm {integrity.get('algorithm')!r}")
  verify_meta(meta)
  bad = mismatches(integrity["state"], array_checksums(state))
  if bad:
    raise CorruptCheckpoint(
      f"{len(bad)} arrays fail their checksums: "
      f"{', '.join(bad[:4])}{', ...' if len(bad) > 4 else ''}"
    )
  if data_state is not None and json_checksum(data_state) != integrity["data"]:
    raise CorruptCheckpoint("the data iterator state fails its checksum")
  return True


def verify_meta(meta: dict) -> None:
  """Checks the metadata record (everything but its own integrity entry) against the digest
  recorded when it was saved; checkpoints written before that digest existed pass unchecked.

  Raises:
    CorruptCheckpoint: the metadata was changed after it was saved, or its integrity entry is
      not the record this module writes.
  """
  integrity = meta.get("integrity")
  if integrity is None:
    return
  if not isinstance(integrity, dict) or not isinstance(integrity.get("state"), dict):
    raise CorruptCheckpoint("the metadata's integrity record is damaged")
  want = integrity.get("meta")
  if want is None:  # written before the metadata had a digest
    return
  got = json_checksum({k: v for k, v in meta.items() if k != "integrity"})
  if got != want:
    raise CorruptCheckpoint("the metadata (run config, model config, tokenizer) fails its checksum")
