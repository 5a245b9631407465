"""Tests of the core: rove_jax/*.py and rove_jax/kernels/."""
