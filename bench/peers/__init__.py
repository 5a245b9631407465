"""Peer implementations for side-by-side speed comparisons (not part of rove_jax)."""
