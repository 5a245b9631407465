"""Tests of the commands, rove_jax/cli."""
