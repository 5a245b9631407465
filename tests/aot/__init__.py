"""Tests of rove_jax/aot."""
