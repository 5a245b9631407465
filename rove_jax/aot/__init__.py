"""Ahead-of-time compiles of a run's programs for TPU/GPU topologies, and their analysis."""
