"""rove-lm-eval (python -m rove_jax.cli.harness): lm-evaluation-harness's `run` command with
the "rove_jax" model registered (the [harness] extra).

    rove-lm-eval --model rove_jax --model_args path=exports/tiny --tasks hellaswag

lm_eval 0.4.13 looks models up in its own registry only: its `lm_eval` command has no
entry-point plugins, so it cannot find a model another package defines. This command imports
rove_jax.evaluation.harness, which registers the model, and then runs lm_eval's own `run`
subcommand: the same options, the same parser, the same outputs (`rove-lm-eval run ...` is
accepted too). lm_eval's other subcommands (`lm-eval ls tasks`, `lm-eval validate`) need no
model: run them with `lm-eval`.

`--batch_size auto` (lm_eval's search for the largest batch, a torch feature) is refused for
the rove_jax model with one line before anything loads: give a number.

One option of its own: --only_include_path indexes only the task files under --include_path.
lm_eval reads all of its built-in task YAMLs (thousands) at every start to find the tasks
named; for local tasks that is most of a short run's time. lm_eval's command has no such
option, so this one sets TaskManager's include_defaults=False for the run.

Exit status: lm_eval's, and 2 for a model_args value or a request the "rove_jax" model cannot
take (rove_jax.evaluation.harness.InputError: a path without a model, a continuation longer
than max_length, a generate_until task whose max_gen_toks leaves no room for a context),
printed as one line `rove-lm-eval: error: ...` (ROVE_JAX_TRACEBACK=1 shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from lm_eval._cli.run import Run
from lm_eval.utils import setup_logging

from rove_jax.cli import platforms
from rove_jax.cli.errors import fail
from rove_jax.evaluation import harness  # registers the "rove_jax" model

PROG = "rove-lm-eval"


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
  """lm_eval's `run` options parsed by lm_eval's own parser (a leading "run" is dropped)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  subparsers = argparse.ArgumentParser(prog=PROG).add_subparsers()
  Run.create(subparsers)  # adds lm_eval's "run" parser, with its options and its action
  parser = subparsers.choices["run"]
  parser.prog = PROG
  parser.usage = f"{PROG} --model rove_jax --model_args path=DIR --tasks TASK ... [options]"
  parser.add_argument(
    "--only_include_path",
    action="store_true",
    help="index only the tasks under --include_path, not lm_eval's built-in "
    "task files (a faster start for local tasks)",
  )
  args = parser.parse_args(argv[1:] if argv[:1] == ["run"] else argv)
  if args.only_include_path and not args.include_path:
    parser.error("--only_include_path needs --include_path DIR (the task files to index)")
  # lm_eval's automatic batch size probes a torch model's memory, which the rove_jax model
  # has not: refused here, before anything loads, rather than as a traceback from lm_eval.
  batch_size = str(getattr(args, "batch_size", None))  # absent: lm_eval's default, a number
  if getattr(args, "model", None) == "rove_jax" and batch_size.startswith("auto"):
    parser.error(
      f"--batch_size {batch_size}: the rove_jax model takes a fixed batch size; "
      f"give a number, e.g. --batch_size 8"
    )
  return args


def _index_only_include_path() -> None:
  """Makes lm_eval's TaskManager skip its built-in tasks (include_defaults=False) in this
  process; lm_eval's `run` builds its TaskManager with the default."""
  from lm_eval.tasks import manager

  init = manager.TaskManager.__init__

  def local_only(self, *a, **k):
    init(self, *a, **{**k, "include_defaults": False})

  manager.TaskManager.__init__ = local_only


def main(argv: Optional[list] = None) -> int:
  args = parse_args(argv)
  platforms.skip_absent_accelerators()
  if vars(args).pop("only_include_path"):  # lm_eval's run takes every other option as is
    _index_only_include_path()
  setup_logging()  # what lm_eval's own command does before it runs
  try:
    args.func(args)
  except harness.InputError as e:
    return fail(str(e), 2, prefix=f"{PROG}: error")
  return 0


if __name__ == "__main__":
  sys.exit(main())
