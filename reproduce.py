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

import argparse
import datetime
import json
import os
import platform
import sys
import time

from study import jobs
from study.recall_runs import (
  RECALL_STUDY,
  _env,
  _recall_records,
  position_records,
  position_studies,
  recall_chance,
  recall_study,
)

ROOT = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(ROOT, "study", "configs", "reproduce.py")
SCALES = ("gpt2_124m", "gpt2_354m")  # --scale: study/paper_recipe.py
# The full evaluation, sized with training to fit about 2.5 hours on 2 cores for everything
# (bench/RESULTS.md has the measured times): 16k perplexity targets a length and setting, and
# RULER at 4x and 8x the training length, the paper's 4k and 8k for its 1k context.
PPL_TOKENS = 16384
RULER_MULTIPLES = (4, 8)
QUICK_STEPS = 8  # --quick's training steps
# The learning-rate grid every rotary encoding is tuned on by default (--sweep-lrs): both
# encodings' best rate lies strictly inside it (results/lr_sweep.md).
SWEEP_LRS = "1e-3,2e-3,4e-3,8e-3,1.6e-2"


def parse_args(argv):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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


def plan(args, rates: dict | None = None) -> list[dict]:
  """The runs, each {encoding, seed, workdir, kind} (+ steps or lr for the checks); with
  `rates` ({encoding: the sweep's chosen rate}) those encodings' main and long runs train at
  their rate, in workdirs named by it:
    main  every encoding x seed (NoPE on its first --nope-seeds seeds), full_eval for the
          first --full-eval-seeds seeds;
    long  RoVE and RoPE (the rotary encodings of --encodings) on the first --long-seeds seeds
          with --long-multiple times the steps;
    lr    the same encodings on the first --lr-seeds seeds at each of --lrs.
  """
  runs, rates = [], rates or {}
  tuned = lambda enc: {"lr": rates[enc]} if enc in rates else {}  # noqa: E731
  suffix = lambda enc: f"-lr{rates[enc]:g}" if enc in rates else ""  # noqa: E731
  full = args.seed_list[: args.full_eval_seeds] if args.full_eval_seeds else args.seed_list
  for enc in args.encoding_list:
    seeds = args.seed_list
    if enc == "nope" and args.nope_seeds:
      seeds = seeds[: args.nope_seeds]
    for seed in seeds:
      runs.append(
        {
          "encoding": enc,
          "seed": seed,
          "kind": "main",
          "full_eval": seed in full,
          "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}{suffix(enc)}"),
          **tuned(enc),
        }
      )
  rotary = [e for e in args.encoding_list if e != "nope"]
  steps = base_steps(args) * args.long_multiple
  for seed in args.seed_list[: args.long_seeds]:
    for enc in rotary:
      runs.append(
        {
          "encoding": enc,
          "seed": seed,
          "kind": "long",
          "steps": steps,
          "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}-steps{steps}{suffix(enc)}"),
          **tuned(enc),
        }
      )
  for lr in args.lr_list:
    for seed in args.seed_list[: args.lr_seeds]:
      for enc in rotary:
        runs.append(
          {
            "encoding": enc,
            "seed": seed,
            "kind": "lr",
            "lr": lr,
            "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}-lr{lr:g}"),
          }
        )
  return runs


def base_steps(args) -> int:
  """The main runs' training steps (--steps, --quick's or the config's)."""
  if args.steps is not None:
    return args.steps
  if args.quick:
    return QUICK_STEPS
  from study.checkout import load_config

  return load_config(CONFIG).steps


def overrides(args, run) -> list[str]:
  o = [f"--config.model.pos_encoding={run['encoding']}", f"--config.seed={run['seed']}"]
  if run.get("steps") is not None:
    o.append(f"--config.steps={run['steps']}")
  elif args.steps is not None or args.quick:
    o.append(f"--config.steps={base_steps(args)}")
  if run.get("lr") is not None:
    o.append(f"--config.optim.lr={run['lr']}")
  if args.quick:
    o += [
      "--config.model.n_layer=1",
      "--config.model.d_model=64",
      "--config.model.n_head=2",
      "--config.model.max_len=32",
      "--config.data.seq_len=32",
      "--config.data.batch_size=8",
      "--config.data.max_files=40",
      "--config.optim.warmup_steps=2",
      "--config.log_every=2",
      "--config.eval_every=4",
      "--config.eval_batches=2",
      "--config.checkpoint_every=4",
      "--config.sample_tokens=0",
    ]
  return o


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


def eval_command(args, runs, eval_dir, ppl_only: bool = False) -> list[str]:
  """The rove-eval command over `runs` (the full suite with PPL_TOKENS and RULER at
  RULER_MULTIPLES of the training length; --quick: the quick suite as it is; ppl_only: its
  perplexity part alone)."""
  cmd = [sys.executable, "-m", "rove_jax.cli.eval", "--workdir", runs[0]["workdir"], "--compare"]
  cmd += [r["workdir"] for r in runs[1:]]
  cmd += ["--suite", "quick" if args.quick else args.suite, "--out", eval_dir, "--yarn", "all"]
  if not args.quick and args.suite == "full":
    from study.checkout import load_config

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


def train_meta(args) -> dict:
  """The training settings every run shares (for the write-up's limits paragraph): the
  config with this invocation's overrides applied."""
  from rove_jax.train import overrides as overrides_lib
  from study.checkout import load_config

  given = overrides_lib.split(overrides(args, {"encoding": "rove", "seed": 0}))
  c = overrides_lib.apply(load_config(CONFIG), given)
  return {
    "steps": c.steps,
    "batch_size": c.data.batch_size,
    "seq_len": c.data.seq_len,
    "lr": c.optim.lr,
    "warmup_steps": c.optim.warmup_steps,
  }


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
