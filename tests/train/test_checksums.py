"""rove_jax.train.checksums: the host (numpy) and device (jitted) paths agree, on every mesh, and
every single-bit flip is detected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rove_jax.train import checksums, sharding


def _arrays(rng):
  return {
    "f32": rng.standard_normal((6, 8)).astype(np.float32),
    "bf16": jnp.asarray(rng.standard_normal((5, 3)), jnp.bfloat16),
    "i32": rng.integers(-9, 9, (7,)).astype(np.int32),
    "u8": rng.integers(0, 255, (4, 4)).astype(np.uint8),
    "bool": rng.random((3, 5)) > 0.5,
    "scalar": np.int32(42),
  }


def test_host_and_device_paths_agree(rng):
  flat = _arrays(rng)
  host = checksums.array_checksums(flat)
  device = {
    name: f"{int(v):08x}"
    for name, v in checksums._sums({k: jnp.asarray(v) for k, v in flat.items()}).items()
  }
  assert host == device
  assert len(set(host.values())) == len(host)  # different arrays, different sums


def test_sharded_equals_unsharded(rng):
  x = rng.standard_normal((8, 16)).astype(np.float32)
  mesh = sharding.make_mesh(1, 4, 2)
  sharded = jax.device_put(x, NamedSharding(mesh, P("fsdp", "tensor")))
  assert len(sharded.addressable_shards) == 8
  want = checksums.array_checksums({"x": x})
  assert checksums.array_checksums({"x": sharded}) == want
  assert {k: f"{int(v):08x}" for k, v in checksums._sums({"x": sharded}).items()} == want


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_every_single_bit_flip_changes_the_checksum(rng, dtype):
  x = (rng.standard_normal(4) * 100).astype(dtype)
  base = checksums.array_checksums({"x": x})["x"]
  raw = x.view(np.uint8)
  for byte in range(raw.size):
    for bit in range(8):
      y = raw.copy()
      y[byte] ^= np.uint8(1 << bit)
      assert checksums.array_checksums({"x": y.view(dtype)})["x"] != base, (byte, bit)
  # and a swap of two elements (same multiset of values) is seen: the sum is position-weighted
  assert checksums.array_checksums({"x": x[::-1].copy()})["x"] != base


def test_json_checksum_is_canonical():
  a = checksums.json_checksum({"b": 1, "a": [1, 2]})
  assert a == checksums.json_checksum({"a": [1, 2], "b": 1})
  assert a != checksums.json_checksum({"a": [2, 1], "b": 1})
