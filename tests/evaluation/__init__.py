"""Tests of rove_jax/evaluation."""
