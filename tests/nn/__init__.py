"""Tests of rove_jax/nn."""
