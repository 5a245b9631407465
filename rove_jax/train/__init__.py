"""The training layer: run configs, the jitted step and loop, checkpoints, resume, metrics,
sharding and the rove-train command."""

from rove_jax import extras

extras.require('train', 'rove_jax.train')
