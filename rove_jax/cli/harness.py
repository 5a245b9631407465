"""rove-lm-eval (python -m rove_jax.cli.harness): lm-evaluation-harness's `run` command with
the "rove_jax" model registered (the [harness] extra).

    rove-lm-eval --model rove_jax --model_args path=exports/tiny --tasks hellaswag

lm_eval 0.4.13 looks models up in its own registry only: its `lm_eval` command has no
entry-point plugins, so it cannot find a model another package defines. This command imports
rove_jax.evaluation.harness, which registers the model, and then runs lm_eval's own `run`
subcommand: the same options, the same parser, the same outputs (`rove-lm-eval run ...` is
accepted too). lm_eval's other subcommands (`lm-eval ls tasks`, `lm-eval validate`) need no
model: run them with `lm-eval`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from lm_eval._cli.run import Run
from lm_eval.utils import setup_logging

from rove_jax.evaluation import harness  # noqa: F401 -- registers the "rove_jax" model

PROG = "rove-lm-eval"


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
  """lm_eval's `run` options parsed by lm_eval's own parser (a leading "run" is dropped)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  subparsers = argparse.ArgumentParser(prog=PROG).add_subparsers()
  Run.create(subparsers)  # adds lm_eval's "run" parser, with its options and its action
  parser = subparsers.choices["run"]
  parser.prog = PROG
  parser.usage = f"{PROG} --model rove_jax --model_args path=DIR --tasks TASK ... [options]"
  return parser.parse_args(argv[1:] if argv[:1] == ["run"] else argv)


def main(argv: Optional[list] = None) -> int:
  args = parse_args(argv)
  setup_logging()  # what lm_eval's own command does before it runs
  args.func(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
