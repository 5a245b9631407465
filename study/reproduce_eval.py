"""reproduce.py's evaluation of the trained runs: the rove-eval commands (the full suite for the
first --full-eval-seeds seeds, perplexity only for the other main runs and the training-length
check), run side by side, and their two reports joined into the one the write-up reads.
"""

from __future__ import annotations

import json
import os
import sys

from study import jobs
from study.checkout import load_config
from study.recall_runs import _env
from study.reproduce_plan import CONFIG

# The full evaluation, sized with training to fit about 2.5 hours on 2 cores for everything
# (bench/RESULTS.md has the measured times): 16k perplexity targets a length and setting, and
# RULER at 4x and 8x the training length, the paper's 4k and 8k for its 1k context.
PPL_TOKENS = 16384
RULER_MULTIPLES = (4, 8)


def eval_command(args, runs, eval_dir, ppl_only: bool = False) -> list[str]:
  """The rove-eval command over `runs` (the full suite with PPL_TOKENS and RULER at
  RULER_MULTIPLES of the training length; --quick: the quick suite as it is; ppl_only: its
  perplexity part alone)."""
  cmd = [sys.executable, "-m", "rove_jax.cli.eval", "--workdir", runs[0]["workdir"], "--compare"]
  cmd += [r["workdir"] for r in runs[1:]]
  cmd += ["--suite", "quick" if args.quick else args.suite, "--out", eval_dir, "--yarn", "all"]
  if not args.quick and args.suite == "full":
    train_len = load_config(CONFIG).data.seq_len
    cmd += ["--ppl-tokens", str(PPL_TOKENS)]
    if not ppl_only:
      cmd += ["--ruler-lengths", ",".join(str(m * train_len) for m in RULER_MULTIPLES)]
  if ppl_only:
    cmd += ["--tasks", "ppl"]
  return cmd


def evaluate_all(args, runs, out_dir) -> tuple[dict, dict | None]:
  """(the main report, the perplexity-only report or None).

  The main runs with full_eval get the full suite into <out>/eval; the other main runs and the
  training-length check's runs get perplexity only into <out>/eval_ppl (the two evaluations
  side by side, --jobs at a time, their output in <dir>/eval.log), and the main ones of those
  join the main report's runs (the write-up reads RULER and ICL from the runs that have them).
  The learning-rate check is read from the runs' held-out losses, not evaluated."""
  full = [r for r in runs if r["kind"] == "main" and r["full_eval"]]
  rest = [r for r in runs if r["kind"] == "long" or r["kind"] == "main" and not r["full_eval"]]
  dirs = {"eval": os.path.join(out_dir, "eval"), "eval_ppl": os.path.join(out_dir, "eval_ppl")}
  todo = [
    jobs.Job(
      "evaluation (full suite)",
      eval_command(args, full, dirs["eval"]),
      os.path.join(dirs["eval"], "eval.log"),
      _env(),
    )
  ]
  if rest:
    todo.append(
      jobs.Job(
        "evaluation (perplexity only)",
        eval_command(args, rest, dirs["eval_ppl"], ppl_only=True),
        os.path.join(dirs["eval_ppl"], "eval.log"),
        _env(),
      )
    )
  for job in todo:
    _say(f"{job.label}: {' '.join(job.cmd[1:])}")
  for job, (rc, _) in zip(todo, jobs.run(todo, args.jobs, log=_say)):
    if rc != 0:
      raise SystemExit(
        f"{job.label} failed (exit {rc}; its log: {job.log}); rerun "
        f"`{' '.join(sys.argv)}` to redo it (training is kept)"
      )
  reports = []
  for d in dirs.values() if rest else [dirs["eval"]]:
    with open(os.path.join(d, "report.json")) as f:
      reports.append(json.load(f))
  if not rest:
    return reports[0], None
  return with_ppl_runs(reports[0], reports[1], runs), reports[1]


def with_ppl_runs(report: dict, ppl: dict, runs) -> dict:
  """The main report with the perplexity-only report's main runs added (not the checks')."""
  main_dirs = {os.path.abspath(r["workdir"]) for r in runs if r["kind"] == "main"}
  return dict(
    report,
    runs=report["runs"] + [r for r in ppl["runs"] if os.path.abspath(r["workdir"]) in main_dirs],
  )


def _say(line: str) -> None:
  print(line, flush=True)
