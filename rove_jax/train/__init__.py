"""The training layer: run configs, the jitted step and loop, checkpoints, resume, metrics, sharding, the CLI."""
