"""Ahead-of-time compiles of a run's programs for TPU/GPU topologies, and their analysis."""

from rove_jax import extras

extras.require("train", "rove_jax.aot")
