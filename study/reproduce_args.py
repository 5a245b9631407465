"""reproduce.py's command line: its flags, their checks (errors exit 2 before any work), and
the learning-rate sweep's grid and seeds parsed from them (study/sweep.py). reproduce.py's
docstring is the --help text.
"""

from __future__ import annotations

import argparse

from study.recall_runs import RECALL_STUDY

SCALES = ("gpt2_124m", "gpt2_354m")  # --scale: study/paper_recipe.py
# The learning-rate grid every rotary encoding is tuned on by default (--sweep-lrs): both
# encodings' best rate lies strictly inside it (results/lr_sweep.md).
SWEEP_LRS = "1e-3,2e-3,4e-3,8e-3,1.6e-2"


def parse_args(argv, description: str) -> argparse.Namespace:
  """The parsed and checked flags; `description` is the --help text (reproduce.py's docstring).

  Sets args.seed_list, args.encoding_list, args.lr_list, args.sweep_grids and
  args.sweep_seed_list besides the flags.
  """
  p = argparse.ArgumentParser(
    description=description, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--out", default="results", help="where README.md, report.json, plots go")
  p.add_argument("--runs-dir", default="runs/reproduce", help="training workdirs")
  p.add_argument(
    "--seeds",
    default="0,1,2,3,4,5,6,7",
    help="seeds for every encoding; seed s is one pair across the encodings (the "
    "same initialisation and batch order)",
  )
  p.add_argument("--encodings", default="rove,rope,nope")
  p.add_argument(
    "--nope-seeds",
    type=int,
    default=3,
    help="how many of the seeds NoPE (the third baseline) runs with (0: all)",
  )
  p.add_argument(
    "--full-eval-seeds",
    type=int,
    default=3,
    help="the first N seeds get the full evaluation (perplexity, RULER, ICL); the "
    "others perplexity only (0: all get the full one)",
  )
  p.add_argument(
    "--long-seeds",
    type=int,
    default=3,
    help="the training-length check: RoVE and RoPE on the first N seeds again "
    "with --long-multiple times the steps (0: no check)",
  )
  p.add_argument("--long-multiple", type=int, default=3)
  p.add_argument(
    "--lrs",
    default="",
    help="without a sweep (--sweep-lrs ''), a learning-rate check: RoVE and RoPE "
    "on the first --lr-seeds seeds at these learning rates besides the "
    "config's ('': no check)",
  )
  p.add_argument("--lr-seeds", type=int, default=1)
  p.add_argument(
    "--sweep-lrs",
    default=None,
    help="tune the learning rate first (study/sweep.py): a grid of at least "
    "4 rates for every rotary encoding ('r1,r2,...') or one each "
    "('rove=...;rope=...'); the main and long runs then train at each "
    f"encoding's chosen rate (default {SWEEP_LRS}; with --quick none; '': "
    f"no sweep, the config's rate)",
  )
  p.add_argument(
    "--sweep-seeds",
    default="100,101,102",
    help="the sweep's seeds (at least 3 pairs a rate), none of them in --seeds",
  )
  p.add_argument(
    "--reuse-sweep",
    action="store_true",
    help="take the rates <out>/lr_sweep.json records for this grid, seeds and "
    "steps (e.g. the committed results/) instead of training the sweep again",
  )
  p.add_argument(
    "--sweep-only", action="store_true", help="stop after the sweep has written <out>/lr_sweep.md"
  )
  p.add_argument(
    "--recall-seeds",
    type=int,
    default=3,
    help="the associative-recall (mqar) retrieval study's seeds: the first N",
  )
  p.add_argument(
    "--position-seeds",
    type=int,
    default=5,
    help="the position-dependent retrieval tasks' seed pairs: the first N seeds (0: not run)",
  )
  p.add_argument("--position-nope-seeds", type=int, default=2)
  p.add_argument("--steps", type=int, help="training steps (default: study/configs/reproduce.py)")
  p.add_argument(
    "--jobs",
    type=int,
    default=None,
    help="children (trainings, evaluations) at a time, each pinned to its own "
    "core (default: study.jobs.default_jobs(), at most 2)",
  )
  p.add_argument("--suite", default="full", choices=("quick", "full"))
  p.add_argument(
    "--quick",
    action="store_true",
    help="tiny settings for tests: 1 layer, few steps, short lengths",
  )
  p.add_argument(
    "--no-recall",
    action="store_true",
    help=f"skip the retrieval study ({RECALL_STUDY}) even when it is present; "
    f"records of an earlier run in <out>/recall/recall.json still go into "
    f"the write-up",
  )
  p.add_argument(
    "--write-only",
    action="store_true",
    help="only redo the write-up from what an earlier run left in --out (its "
    "report, retrieval records and meta), e.g. after a change to the "
    "write-up; give the same --runs-dir, --seeds and --encodings",
  )
  p.add_argument(
    "--note", help="a line for the write-up's header (e.g. what a resumed run did before)"
  )
  p.add_argument(
    "--scale",
    choices=SCALES,
    help="the paper-scale recipe instead (GPT-2 on your FineWeb-Edu shards): "
    "see `python reproduce.py --scale gpt2_124m --help`",
  )
  args = p.parse_args(argv)
  try:
    args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
  except ValueError:
    p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
  args.encoding_list = [e.strip() for e in args.encodings.split(",") if e.strip()]
  from rove_jax.nn.model import POS_ENCODINGS

  bad = [e for e in args.encoding_list if e not in POS_ENCODINGS]
  if bad or not args.encoding_list:
    p.error(f"--encodings: unknown {bad}; choose from {POS_ENCODINGS}")
  if not args.seed_list:
    p.error("--seeds: give at least one seed")
  if args.steps is not None and args.steps < 1:
    p.error("--steps must be >= 1")
  for flag in (
    "nope_seeds",
    "full_eval_seeds",
    "long_seeds",
    "lr_seeds",
    "recall_seeds",
    "position_seeds",
    "position_nope_seeds",
  ):
    if getattr(args, flag) < 0:
      p.error(f"--{flag.replace('_', '-')} must be >= 0")
  if args.long_multiple < 2:
    p.error("--long-multiple must be >= 2 (the check trains longer than the main runs)")
  try:
    args.lr_list = [float(x) for x in args.lrs.split(",") if x.strip()]
  except ValueError:
    p.error(f"--lrs must be comma-separated numbers, got {args.lrs!r}")
  if any(not 0 < lr < 1 for lr in args.lr_list):
    p.error(f"--lrs: learning rates must be in (0, 1), got {args.lr_list}")
  _parse_sweep(p, args)
  return args


def _parse_sweep(p, args) -> None:
  """args.sweep_grids ({encoding: rates}, {} without a sweep) and args.sweep_seed_list."""
  from study import sweep

  args.sweep_grids, args.sweep_seed_list = {}, []
  if args.sweep_lrs is None:
    args.sweep_lrs = "" if args.quick else SWEEP_LRS
  if args.sweep_only and not args.sweep_lrs:
    p.error("--sweep-only needs --sweep-lrs")
  if args.sweep_lrs:
    try:
      args.sweep_grids, args.sweep_seed_list = sweep.from_flags(
        args.sweep_lrs, args.sweep_seeds, args.encoding_list, args.seed_list
      )
    except ValueError as e:
      p.error(str(e))
    args.lr_list = []  # the sweep replaces the learning-rate check
