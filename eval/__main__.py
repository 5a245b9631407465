"""python -m eval: the evaluation command from a checkout (the same as `rove-eval`)."""

import sys

from rove_jax.cli.eval import main

if __name__ == "__main__":
  sys.exit(main())
