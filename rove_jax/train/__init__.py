"""The training layer: run configs, the jitted step and loop, checkpoints, resume, metrics,
sharding, and reading a finished run back for evaluation and export. The rove-train command
that drives it is rove_jax.cli.train."""

from rove_jax import extras

extras.require("train", "rove_jax.train")
