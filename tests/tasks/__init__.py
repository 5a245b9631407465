"""Tests of rove_jax/tasks."""
