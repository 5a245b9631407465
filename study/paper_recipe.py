"""The paper-scale recipe of reproduce.py: GPT-2 124M or 354M on FineWeb-Edu at context 1024,
one run per positional encoding and seed, evaluated with the paper's protocol (RoVE, arXiv
2606.11275, section 4).

  python reproduce.py --scale gpt2_124m|gpt2_354m --data '/data/fineweb-edu/*.parquet'
      [--icl-tasks SPECS.json] [--squad FILE] [--hotpot FILE] [--encodings rove,rope]
      [--seeds 0] [--sweep-lrs R,R,R,R] [--sweep-seeds 100,101,102] [--sweep-steps N]
      [--topology v4-32] [--runs-dir DIR] [--out DIR] [--dry-run]

The plan tunes first (study/paper_sweep.py, study/sweep.py's rule): each rotary encoding at
every rate of --sweep-lrs (default 5, spaced by 2x around the preset's lr; '' skips it) on the
--sweep-seeds, lr_sweep.md written to --out, a best rate at its grid's edge stopping the recipe.
Then, for each encoding x seed at its chosen rate, one train.py command with the preset's paper
config (configs/PRESET.py; rove_jax/train/run_config.py:paper_config labels what is assumed),
the data, and the mesh and grad_accum bench/aot_results records for --topology (the sweep's
alike); then one rove-eval over these runs: perplexity from 512 to 16384 tokens without and
with YaRN, RULER by NLL, DCLM Core few-shot accuracy from local task files (--icl-tasks). The
cost, from the compiled figures, ends in the expected device-hours of sweep and comparison:
bounds, not measurements.
--dry-run prints the plan and exits 0 (the data is only checked to exist); otherwise the
commands run in order (a rerun resumes each run from its newest checkpoint), report in --out.

This module is the command line and the run; study/paper_plan.py builds the plan and
study/paper_text.py prints it and writes the README.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
import time

from rove_jax.nn.model_config import POS_ENCODINGS
from study import paper_sweep
from study.checkout import ROOT, git_commit, load_config
from study.paper_plan import build_plan, compiled_rows
from study.paper_text import format_plan, write_readme

# rove_jax.data (its package loads grain), rove_jax.cli.eval, rove_jax.aot.compile,
# rove_jax.evaluation.tasks and rove_jax.nn.model (flax, optax, orbax) are imported inside the
# functions that use them, here and in study/paper_plan.py and study/paper_text.py: loading the
# recipe's modules loads none of them.

AOT_DIR = os.path.join(ROOT, "bench", "aot_results")
PRESETS = ("gpt2_124m", "gpt2_354m")
EXAMPLE_DATA = "/data/fineweb-edu/sample/10BT/*.parquet"


def parse_args(argv) -> argparse.Namespace:
  """Parses and checks the --scale command line; errors exit 2 before any work.

  Sets args.seed_list, args.encoding_list, args.data_files (the matched shards, not read),
  args.runs_dir and args.out (defaults from the preset).
  """
  p = argparse.ArgumentParser(
    prog="reproduce.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--scale", required=True, choices=PRESETS, help="the paper's model size")
  p.add_argument(
    "--data",
    metavar="PATH_GLOB",
    help=f"FineWeb-Edu parquet shards you have (a file, directory or glob, e.g. "
    f"'{EXAMPLE_DATA}'); nothing is downloaded. Needed to run; a --dry-run "
    f"without it plans for {EXAMPLE_DATA!r}",
  )
  p.add_argument(
    "--icl-tasks",
    metavar="SPECS.json",
    help="DCLM Core task specs (LLM-Foundry JSONL files, local); without it Core is skipped",
  )
  p.add_argument("--squad", metavar="FILE", help="local SQuAD dev JSON for RULER qa_1")
  p.add_argument("--hotpot", metavar="FILE", help="local HotpotQA dev JSON for RULER qa_2")
  p.add_argument("--encodings", default="rove,rope", help="comma-separated (default rove,rope)")
  p.add_argument("--seeds", default="0", help="comma-separated (default one seed: a cost choice)")
  paper_sweep.add_flags(p)
  p.add_argument(
    "--topology",
    help="slice to train on (v5e-16, v4-32, h200-8, ...): the mesh, "
    "grad_accum and cost come from its compiled figures "
    "(default: the cheapest compiled one for the preset)",
  )
  p.add_argument("--runs-dir", help="training workdirs (default runs/PRESET)")
  p.add_argument("--out", help="report directory (default results_PRESET)")
  p.add_argument(
    "--aot-dir",
    default=AOT_DIR,
    help="the compiled figures (python -m bench.aot --json); default bench/aot_results",
  )
  p.add_argument(
    "--dry-run",
    action="store_true",
    help="print the plan, its cost and its assumptions; run nothing",
  )
  args = p.parse_args(argv)
  try:
    args.seed_list = list(dict.fromkeys(int(s) for s in args.seeds.split(",") if s.strip()))
  except ValueError:
    p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
  if not args.seed_list:
    p.error("--seeds: give at least one seed")
  args.encoding_list = list(
    dict.fromkeys(e.strip() for e in args.encodings.split(",") if e.strip())
  )
  bad = [e for e in args.encoding_list if e not in POS_ENCODINGS]
  if bad or not args.encoding_list:
    p.error(f"--encodings: unknown {bad}; choose from {POS_ENCODINGS}")
  paper_sweep.check_flags(p, args, load_config(args.scale))
  from rove_jax.data import files  # heavy: see the note above AOT_DIR

  if args.data is None and not args.dry_run:
    p.error(
      f"--data is required to run the plan: the FineWeb-Edu parquet shards you have, e.g. "
      f"--data '{EXAMPLE_DATA}' (a --dry-run plans without it)"
    )
  args.data = os.path.expanduser(args.data or EXAMPLE_DATA)
  try:
    args.data_files, _ = files.resolve_files(args.data, files.PARQUET_EXTENSIONS, "--data")
  except ValueError as e:
    if not args.dry_run:
      p.error(f"{e}; give the FineWeb-Edu parquet shards you have, e.g. --data '{EXAMPLE_DATA}'")
    args.data_files = None  # a dry run plans for shards it need not see
  from rove_jax.cli import eval as cli  # heavy: see the note above AOT_DIR

  cli.check_task_files(p, args)  # the evaluation's input files, now, not after days of training
  if args.topology:
    args.topology_name = _topology_name(p, args.topology, args.aot_dir, args.scale)
  args.runs_dir = args.runs_dir or os.path.join("runs", args.scale)
  args.out = args.out or f"results_{args.scale}"
  if os.path.abspath(args.out) == os.path.join(ROOT, "results"):
    p.error("--out results is the small-scale study's write-up; choose another directory")
  return args


def _topology_name(p, given: str, aot_dir: str, preset: str) -> str:
  """--topology as the compiled reports name it ("v4-32" -> "v4:2x2x4"); an error if unknown."""
  for r in compiled_rows(aot_dir, preset):
    if given.lower() in {str(r.get(k)).lower() for k in ("name", "topology", "accelerator")}:
      return r["topology"]
  # A topology nothing was compiled for yet: check its name (heavy: see the note above AOT_DIR).
  from rove_jax.aot import compile as aot

  try:
    return aot.parse_topology(given).name
  except ValueError as e:
    p.error(f"--topology: {e}")


def execute(plan, args, text: str, argv) -> int:
  """Trains the sweep and writes lr_sweep.md (paper_sweep.tune; an edge stops here), then every
  comparison run at its chosen rate (resuming), evaluates those and writes --out/README.md."""
  t0, started = time.perf_counter(), datetime.datetime.now(datetime.timezone.utc)
  meta = {
    "command": "python reproduce.py " + shlex.join(argv),
    "commit": git_commit(),
    "started": started.isoformat(timespec="seconds"),
  }
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "plan.txt"), "w") as f:
    f.write(text + "\n")
  chosen = paper_sweep.tune(
    plan, args, meta, lambda runs: _train(runs, meta), log=lambda line: print(line, flush=True)
  )
  paper_sweep.settle(plan, chosen)  # lr_sweep.md is written: the comparison trains at its rates
  _train(plan["runs"], meta)
  print("evaluating:", shlex.join(plan["eval"]), flush=True)
  env = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
  }
  rc = subprocess.call([sys.executable] + plan["eval"][1:], env=env)
  if rc != 0:
    raise SystemExit(
      f"evaluation failed (exit {rc}); the trained runs are kept: rerun `{meta['command']}`"
    )
  meta["wall_seconds"] = time.perf_counter() - t0
  path = write_readme(args.out, plan, text, meta)
  print(f"wrote {path} in {meta['wall_seconds'] / 3600:.2f} h")
  return 0


def _train(runs, meta) -> None:
  """Trains `runs` in order (train.py resumes or skips a finished one); records train_seconds."""
  for i, run in enumerate(runs):
    print(
      f"[{i + 1}/{len(runs)}] {run['encoding']} seed {run['seed']} -> {run['workdir']}", flush=True
    )
    t = time.perf_counter()
    rc = subprocess.call([sys.executable] + run["train"][1:])
    run["train_seconds"] = time.perf_counter() - t
    if rc != 0:
      raise SystemExit(
        f"training {run['workdir']} failed (exit {rc}); rerun `{meta['command']}` to resume it"
      )


def main(argv) -> int:
  """`python reproduce.py --scale ...`: prints the plan; unless --dry-run, runs it."""
  args = parse_args(argv)
  plan = build_plan(args)
  text = format_plan(plan, args)
  print(text, flush=True)
  if args.dry_run:
    return 0
  return execute(plan, args, text, argv)
