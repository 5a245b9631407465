"""python -m eval: the evaluation command from a checkout (the same as `rove-eval`)."""

import sys

from rove_jax.evaluation.cli import main

if __name__ == "__main__":
  sys.exit(main())
