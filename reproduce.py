"""The paper's RoPE vs RoVE comparison at small scale: train matched runs, evaluate them all,
write results/ (README.md with the paper-layout tables and 95 % intervals, report.json, plots).

  python reproduce.py [--out results] [--runs-dir runs/reproduce] [--seeds 0,...,7]
                      [--encodings rove,rope,nope] [--nope-seeds 3] [--full-eval-seeds 3]
                      [--sweep-lrs R,R,R,R] [--sweep-seeds 100,101,102] [--sweep-only]
                      [--reuse-sweep]
                      [--long-seeds 3] [--long-multiple 3] [--lrs R,R] [--lr-seeds 1]
                      [--recall-seeds 3] [--position-seeds 5] [--position-nope-seeds 2]
                      [--steps N] [--quick] [--no-recall]

Every run uses study/configs/reproduce.py with the same data, steps and size; only the positional
encoding, the seed and (after the sweep) the learning rate differ, and seed s is one pair across
the encodings (the same initialisation and batch order). First the learning rate is tuned
(study/sweep.py; its rule and the comparisons it feeds are fixed in study/preregistration.md):
RoVE and RoPE at every rate of --sweep-lrs (default SWEEP_LRS) on the --sweep-seeds (not the
comparison's), each encoding's rate chosen by the sweep's rule (lowest mean final held-out
loss; a best rate at the grid's edge is refused and nothing more trains), and <out>/lr_sweep.md
written. With --reuse-sweep a sweep that <out>/lr_sweep.json already records, with the same
grid, seeds and steps, is not trained again (the committed results/lr_sweep.json lets a later
checkout train the comparison alone); --sweep-only stops after lr_sweep.md, e.g. to extend a
grid whose best rate was at its edge; --sweep-lrs '' trains at the config's rate. Then the runs
(`plan`), each rotary encoding at its chosen rate:
  main  RoVE and RoPE on every seed (8 pairs), NoPE on the first --nope-seeds; the first
        --full-eval-seeds seeds get the full evaluation (perplexity, RULER, ICL: <out>/eval),
        the others perplexity only (<out>/eval_ppl), which joins the perplexity rows;
  long  RoVE and RoPE on the first --long-seeds seeds with --long-multiple times the steps, on
        their own schedule (perplexity only): is the gap convergence speed or final quality?
  lr    without a sweep, RoVE and RoPE on the first --lr-seeds seeds at each of --lrs
        (held-out loss only).
The evaluation scores every setting (`--yarn all`: no YaRN, YaRN with factor L / T, YaRN with
one fixed factor). Then, when study/retrieval.py is present (and not --no-recall), the
retrieval studies run: associative recall (task mqar, the first --recall-seeds seeds) into
<out>/recall/, and the position-dependent tasks (study.recall_runs.POSITION_TASKS, the first
--position-seeds seeds, NoPE on --position-nope-seeds) into <out>/recall_<task>/:

  python -m study.retrieval --out <out>/recall_<task> --runs-dir <runs-dir>/recall_<task>
      --task TASK --seeds S --encodings E --nope-seeds N [--quick]

and their records go into the write-up. Rerunning resumes: finished runs are kept (their
checkpoints are the record), unfinished ones continue from their newest checkpoint, and the
evaluation, the retrieval studies' scoring and the write-up are redone. --quick shrinks
everything for tests (a few steps, short lengths); its output says so at the top.

  python reproduce.py --scale gpt2_124m|gpt2_354m --data GLOB [--dry-run] ...

runs the paper-scale recipe instead (its own flags: --scale X --help; study/paper_recipe.py).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time

from study import jobs, reproduce_args
from study.recall_runs import (  # noqa: F401 (RECALL_STUDY, for reproduce.RECALL_STUDY)
  RECALL_STUDY,
  _recall_records,
  position_records,
  position_studies,
  recall_chance,
  recall_study,
)

# The command line, the plan and the evaluation have their own modules; their names stay
# importable from here (study/preregistration.md names reproduce.SWEEP_LRS; tests use the rest).
from study.reproduce_args import SCALES, SWEEP_LRS  # noqa: F401
from study.reproduce_eval import (  # noqa: F401
  PPL_TOKENS,
  RULER_MULTIPLES,
  eval_command,
  evaluate_all,
  with_ppl_runs,
)
from study.reproduce_plan import (  # noqa: F401
  CONFIG,
  QUICK_STEPS,
  base_steps,
  overrides,
  plan,
  train_meta,
)

ROOT = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv):
  """The command line (study/reproduce_args.py), with this docstring as its --help."""
  return reproduce_args.parse_args(argv, __doc__)


def train_all(args, runs) -> None:
  """Trains every run (train.py resumes or skips a finished one), --jobs at a time, each
  child's output in <workdir>/train.log; records train_seconds."""
  todo = [
    jobs.Job(
      f"[{i + 1}/{len(runs)}] {r['encoding']} seed {r['seed']} ({r['kind']}) -> {r['workdir']}",
      [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config",
        CONFIG,
        "--workdir",
        r["workdir"],
      ]
      + overrides(args, r),
      os.path.join(r["workdir"], "train.log"),
    )
    for i, r in enumerate(runs)
  ]
  for run, (rc, secs) in zip(runs, jobs.run(todo, args.jobs, log=_say)):
    run["train_seconds"] = secs
    if rc is not None and rc != 0:
      raise SystemExit(
        f"training {run['workdir']} failed (exit {rc}, its log: "
        f"{run['workdir']}/train.log); rerun `{' '.join(sys.argv)}` to resume it"
      )


def _say(line: str) -> None:
  print(line, flush=True)


def machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  import jax

  return (
    f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}, "
    f"Python {platform.python_version()}, jax {jax.__version__}, "
    f"device {jax.devices()[0].device_kind}"
  )


def commit() -> str:
  from study.checkout import git_commit

  return git_commit()


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if any(a == "--scale" or a.startswith("--scale=") for a in argv):
    from study import paper_recipe  # its own flags: --data, --topology, --dry-run, ...

    return paper_recipe.main(argv)
  args = parse_args(argv)
  if args.write_only:
    return rewrite(args)
  t0 = time.perf_counter()
  started = datetime.datetime.now(datetime.timezone.utc)
  code_version = commit()  # at the start: the code that trains and evaluates
  os.makedirs(args.out, exist_ok=True)
  command = " ".join(["python reproduce.py", *argv])
  rates = tune(args, code_version, command)  # lr_sweep.md is written before any comparison run
  if args.sweep_only:
    return 0
  runs = plan(args, rates)
  train_all(args, runs)
  report, ppl_report = evaluate_all(args, runs, args.out)
  recall = recall_study(
    args, os.path.join(args.out, "recall"), seeds=args.seed_list[: args.recall_seeds or None]
  )
  positions = position_studies(args)
  recall_rerun = recall is not None and not args.no_recall
  from rove_jax.train.metrics import read_metrics
  from study import writeup

  curves = {r["workdir"]: read_metrics(r["workdir"]) for r in runs}
  meta = {
    "command": command,
    "commit": code_version,
    "machine": machine(),
    "started": started.isoformat(timespec="seconds"),
    "wall_seconds": time.perf_counter() - t0,
    "quick": args.quick,
    "train_seconds": {r["workdir"]: r.get("train_seconds") for r in runs},
    "recall_rerun": recall_rerun,
    "train": train_meta(args),
  }
  if rates:
    from study import sweep

    meta["lr_sweep"] = {**(sweep.load_record(args.out) or {}), "chosen": rates, "file": sweep.MD}
  if args.note:
    meta["notes"] = args.note
  writeup.write(
    args.out,
    report,
    runs,
    curves,
    meta,
    recall=recall,
    ppl_report=ppl_report,
    positions=positions,
    recall_chance=recall_chance(args.out),
  )
  print(f"wrote {os.path.join(args.out, 'README.md')} in {meta['wall_seconds'] / 60:.1f} min")
  return 0


def _sweep_choice(args) -> dict:
  """The earlier sweep's chosen rates (<out>/lr_sweep.json) when --sweep-lrs is given."""
  if not args.sweep_grids:
    return {}
  from study import sweep

  return sweep.load_choice(args.out)


def tune(args, code_version: str, command: str) -> dict:
  """The learning-rate sweep (--sweep-lrs; {} without): study.sweep.tune trains its runs,
  writes <out>/lr_sweep.md and returns {encoding: chosen rate}, or stops the command when a
  best rate is at its grid's edge."""
  if not args.sweep_grids:
    return {}
  from study import sweep

  meta = {"command": command, "commit": code_version, "steps": base_steps(args)}
  return sweep.tune(
    args.sweep_grids,
    args.sweep_seed_list,
    args.runs_dir,
    args.out,
    lambda runs: train_all(args, runs),
    meta,
    log=_say,
    reuse=args.reuse_sweep,
  )


def rewrite(args) -> int:
  """--write-only: results/README.md and the rest of the write-up again, from the earlier run's
  <out>/eval/report.json, <out>/summary.json (its meta) and <out>/recall/recall.json; nothing
  is trained or evaluated. The meta gains a note naming the commit that rewrote it."""
  from rove_jax.train.metrics import read_metrics
  from study import writeup

  report_path = os.path.join(args.out, "eval", "report.json")
  summary_path = os.path.join(args.out, "summary.json")
  missing = [p for p in (report_path, summary_path) if not os.path.exists(p)]
  if missing:
    raise SystemExit(
      f"--write-only needs an earlier run's {' and '.join(missing)}; run "
      f"`python reproduce.py --out {args.out}` first"
    )
  with open(report_path) as f:
    report = json.load(f)
  with open(summary_path) as f:
    meta = json.load(f)["meta"]
  runs = plan(args, _sweep_choice(args))
  if [r["workdir"] for r in runs] != list(meta.get("train_seconds") or {}):
    raise SystemExit(
      f"--write-only: the runs {[r['workdir'] for r in runs]} are not the "
      f"earlier run's {list(meta.get('train_seconds') or {})}; give the same "
      f"--runs-dir, --seeds and --encodings as `{meta.get('command')}`"
    )
  recall_path = os.path.join(args.out, "recall", "recall.json")
  recall = _recall_records(recall_path) if os.path.exists(recall_path) else None
  ppl_path = os.path.join(args.out, "eval_ppl", "report.json")
  ppl_report = None
  if os.path.exists(ppl_path):
    with open(ppl_path) as f:
      ppl_report = json.load(f)
    report = with_ppl_runs(report, ppl_report, runs)
  meta.setdefault("recall_rerun", "--no-recall" not in (meta.get("command") or "").split())
  meta.setdefault("train", train_meta(args))
  lost = [
    r["workdir"] for r in runs if not os.path.exists(os.path.join(r["workdir"], "metrics.jsonl"))
  ]
  if lost:  # the loss curves and the limits paragraph are drawn from them: refuse, lose none
    raise SystemExit(
      f"--write-only needs every run's metrics.jsonl for the loss curves; "
      f"missing in {', '.join(lost)}: give the --runs-dir the runs were trained "
      f"in (nothing was written)"
    )
  note = f"write-up redone from the same report by `python reproduce.py --write-only` at {commit()}"
  meta["notes"] = f"{meta['notes']}; {note}" if meta.get("notes") else note
  curves = {r["workdir"]: read_metrics(r["workdir"]) for r in runs}
  writeup.write(
    args.out,
    report,
    runs,
    curves,
    meta,
    recall=recall,
    ppl_report=ppl_report,
    positions=position_records(args.out),
    recall_chance=recall_chance(args.out),
  )
  print(f"rewrote {os.path.join(args.out, 'README.md')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
