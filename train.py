"""Train a RoVE (or baseline) GPT from a checkout (the same as the `rove-train` command).

  python train.py --config configs/tiny.py --workdir runs/tiny [--config.field=value ...]

See rove_jax/cli/train.py for the flags.
"""

from rove_jax.cli.train import run

if __name__ == "__main__":
  run()
