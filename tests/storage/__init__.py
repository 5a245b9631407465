"""Tests of rove_jax/storage."""
