"""Benchmarks: alternatives measured in one process, interleaved, as medians and ratios."""
