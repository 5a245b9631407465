"""Tests of rove_jax/data."""
