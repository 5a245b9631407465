"""Tests of rove_jax/train."""
