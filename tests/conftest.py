"""Strict test configuration: rank promotion raises, 8 fake CPU devices for sharding tests."""

import os

# Must happen before JAX initialises its backends.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")


def has_gpu() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def pytest_collection_modifyitems(config, items):
  if has_gpu():
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture
def rng():
  return np.random.default_rng(0)
