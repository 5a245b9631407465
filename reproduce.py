"""The paper's RoPE vs RoVE comparison at small scale: train matched runs, evaluate them all,
write results/ (README.md with the paper-layout tables and 95 % intervals, report.json, plots).

  python reproduce.py [--out results] [--runs-dir runs/reproduce] [--seeds 0,1,2]
                      [--encodings rove,rope,nope] [--nope-seeds N] [--steps N] [--quick]
                      [--no-recall]

Every run uses study/configs/reproduce.py with the same data, steps and size; only the positional
encoding and the seed differ (every encoding, NoPE included, runs every seed unless
--nope-seeds says fewer). The evaluation scores every setting (`--yarn all`: no YaRN, YaRN
with factor L / T, YaRN with one fixed factor). Then, when study/retrieval.py
is present (and not --no-recall), the retrieval study runs into <out>/recall/:

  python -m study.retrieval --out <out>/recall --runs-dir <runs-dir>/recall
      --seeds S --encodings E [--quick]

and its records (<out>/recall/recall.json: a list of records, or {"records": [...]}) go into
the write-up. Rerunning resumes: finished runs are kept (their checkpoints are the record),
unfinished ones continue from their newest checkpoint, and the evaluation, the retrieval
study's scoring and the write-up are redone. --quick shrinks everything for tests (a few
steps, short lengths); its output says so at the top.

  python reproduce.py --scale gpt2_124m|gpt2_354m --data GLOB [--dry-run] ...

runs the paper-scale recipe instead (its own flags: --scale X --help; study/paper_recipe.py).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(ROOT, "study", "configs", "reproduce.py")
RECALL_STUDY = "study.retrieval"  # the retrieval study, when present
SCALES = ("gpt2_124m", "gpt2_354m")  # --scale: study/paper_recipe.py
# The full evaluation, sized with training to fit about 2 hours on 2 cores for the 9 runs
# (bench/RESULTS.md has the measured times): 16k perplexity targets a length and setting, and
# RULER at 4x and 8x the training length, the paper's 4k and 8k for its 1k context.
PPL_TOKENS = 16384
RULER_MULTIPLES = (4, 8)


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="results", help="where README.md, report.json, plots go")
  p.add_argument("--runs-dir", default="runs/reproduce", help="training workdirs")
  p.add_argument("--seeds", default="0,1,2", help="seeds for every encoding")
  p.add_argument("--encodings", default="rove,rope,nope")
  p.add_argument("--nope-seeds", type=int, default=None,
                 help="how many of the seeds NoPE (the third baseline) runs with (default: all)")
  p.add_argument("--steps", type=int, help="training steps (default: study/configs/reproduce.py)")
  p.add_argument("--suite", default="full", choices=("quick", "full"))
  p.add_argument("--quick", action="store_true",
                 help="tiny settings for tests: 1 layer, few steps, short lengths")
  p.add_argument("--no-recall", action="store_true",
                 help=f"skip the retrieval study ({RECALL_STUDY}) even when it is present; "
                      f"records of an earlier run in <out>/recall/recall.json still go into "
                      f"the write-up")
  p.add_argument("--write-only", action="store_true",
                 help="only redo the write-up from what an earlier run left in --out (its "
                      "report, retrieval records and meta), e.g. after a change to the "
                      "write-up; give the same --runs-dir, --seeds and --encodings")
  p.add_argument("--note", help="a line for the write-up's header (e.g. what a resumed run "
                                "did before)")
  p.add_argument("--scale", choices=SCALES,
                 help="the paper-scale recipe instead (GPT-2 on your FineWeb-Edu shards): "
                      "see `python reproduce.py --scale gpt2_124m --help`")
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
  if args.nope_seeds is not None and args.nope_seeds < 1:
    p.error("--nope-seeds must be >= 1")
  return args


def plan(args) -> list[dict]:
  """The runs: every encoding x seed (NoPE on its first --nope-seeds seeds when given)."""
  runs = []
  for enc in args.encoding_list:
    seeds = args.seed_list
    if enc == "nope" and args.nope_seeds is not None:
      seeds = seeds[: args.nope_seeds]
    for seed in seeds:
      runs.append({"encoding": enc, "seed": seed,
                   "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}")})
  return runs


def overrides(args, run) -> list[str]:
  o = [f"--config.model.pos_encoding={run['encoding']}", f"--config.seed={run['seed']}"]
  if args.steps is not None:
    o.append(f"--config.steps={args.steps}")
  if args.quick:
    o += ["--config.model.n_layer=1", "--config.model.d_model=64", "--config.model.n_head=2",
          "--config.model.max_len=32", "--config.data.seq_len=32", "--config.data.batch_size=8",
          "--config.data.max_files=40", "--config.optim.warmup_steps=2",
          "--config.log_every=2", "--config.eval_every=4", "--config.eval_batches=2",
          "--config.checkpoint_every=4", "--config.sample_tokens=0"]
    if args.steps is None:
      o.append("--config.steps=8")
  return o


def train_all(args, runs) -> None:
  for i, run in enumerate(runs):
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", CONFIG,
           "--workdir", run["workdir"]] + overrides(args, run)
    print(f"[{i + 1}/{len(runs)}] {run['encoding']} seed {run['seed']} -> {run['workdir']}",
          flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd)
    run["train_seconds"] = time.perf_counter() - t0
    if rc != 0:
      raise SystemExit(f"training {run['workdir']} failed (exit {rc}); rerun "
                       f"`{' '.join(sys.argv)}` to resume it")


def eval_command(args, runs, eval_dir) -> list[str]:
  """The rove-eval command over every run (the full suite with PPL_TOKENS and RULER at
  RULER_MULTIPLES of the training length; --quick: the quick suite as it is)."""
  cmd = [sys.executable, "-m", "rove_jax.evaluation.cli", "--workdir", runs[0]["workdir"],
         "--compare"]
  cmd += [r["workdir"] for r in runs[1:]]
  cmd += ["--suite", "quick" if args.quick else args.suite, "--out", eval_dir, "--yarn", "all"]
  if not args.quick and args.suite == "full":
    from study.paper_recipe import load_config
    train_len = load_config(CONFIG).data.seq_len
    cmd += ["--ppl-tokens", str(PPL_TOKENS),
            "--ruler-lengths", ",".join(str(m * train_len) for m in RULER_MULTIPLES)]
  return cmd


def evaluate_all(args, runs, eval_dir) -> dict:
  cmd = eval_command(args, runs, eval_dir)
  print("evaluating:", " ".join(cmd[1:]), flush=True)
  rc = subprocess.call(cmd, env=_env())
  if rc != 0:
    raise SystemExit(f"evaluation failed (exit {rc})")
  with open(os.path.join(eval_dir, "report.json")) as f:
    return json.load(f)


def _env() -> dict:
  """rove_jax from this checkout even when it is not installed (train.py finds it by its
  path)."""
  return {**os.environ, "PYTHONPATH": os.pathsep.join(
      p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}


def recall_available() -> bool:
  """Whether the retrieval study's module is present with a callable main()."""
  if importlib.util.find_spec(RECALL_STUDY) is None:
    return False
  return callable(getattr(importlib.import_module(RECALL_STUDY), "main", None))


def recall_study(args, out_dir) -> list | None:
  """Runs the retrieval study into out_dir (module docstring) and returns its records; None
  when it is skipped (--no-recall or the module is not present)."""
  path = os.path.join(out_dir, "recall.json")
  if args.no_recall or not recall_available():
    why = "--no-recall given" if args.no_recall else f"{RECALL_STUDY} not present"
    if args.no_recall and os.path.exists(path):
      print(f"retrieval study: not rerun ({why}); the write-up uses the records of an earlier "
            f"run in {path}", flush=True)
      return _recall_records(path)
    print(f"retrieval study: skipped ({why})", flush=True)
    return None
  cmd = [sys.executable, "-m", RECALL_STUDY, "--out", out_dir, "--runs-dir",
         os.path.join(args.runs_dir, "recall"), "--seeds", ",".join(map(str, args.seed_list)),
         "--encodings", ",".join(args.encoding_list)] + (["--quick"] if args.quick else [])
  print("retrieval study:", " ".join(cmd[1:]), flush=True)
  rc = subprocess.call(cmd, env=_env())
  if rc != 0:
    raise SystemExit(f"the retrieval study failed (exit {rc}); rerun `{' '.join(sys.argv)}` "
                     f"to resume it")
  return _recall_records(path)


def _recall_records(path) -> list:
  with open(path) as f:
    data = json.load(f)
  return data["records"] if isinstance(data, dict) else data


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
  return (f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}, jax {jax.__version__}, "
          f"device {jax.devices()[0].device_kind}")


def commit() -> str:
  from study.paper_recipe import git_commit
  return git_commit()


def train_meta(args) -> dict:
  """The training settings every run shares (for the write-up's limits paragraph): the
  config with this invocation's overrides applied."""
  import ast
  from study.paper_recipe import load_config
  c = load_config(CONFIG)
  for o in overrides(args, {"encoding": "rove", "seed": 0}):
    key, value = o[len("--config."):].split("=", 1)
    *parents, leaf = key.split(".")
    node = c
    for part in parents:
      node = node[part]
    try:
      node[leaf] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      node[leaf] = value
  return {"steps": c.steps, "batch_size": c.data.batch_size, "seq_len": c.data.seq_len,
          "lr": c.optim.lr, "warmup_steps": c.optim.warmup_steps}


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
  runs = plan(args)
  code_version = commit()  # at the start: the code that trains and evaluates
  os.makedirs(args.out, exist_ok=True)
  train_all(args, runs)
  eval_dir = os.path.join(args.out, "eval")
  report = evaluate_all(args, runs, eval_dir)
  recall = recall_study(args, os.path.join(args.out, "recall"))
  recall_rerun = recall is not None and not args.no_recall
  from study import writeup as results_writeup
  from rove_jax.train.metrics import read_metrics
  curves = {r["workdir"]: read_metrics(r["workdir"]) for r in runs}
  meta = {"command": "python reproduce.py " + " ".join(sys.argv[1:] if argv is None else argv),
          "commit": code_version, "machine": machine(),
          "started": started.isoformat(timespec="seconds"),
          "wall_seconds": time.perf_counter() - t0, "quick": args.quick,
          "train_seconds": {r["workdir"]: r.get("train_seconds") for r in runs},
          "recall_rerun": recall_rerun, "train": train_meta(args)}
  if args.note:
    meta["notes"] = args.note
  results_writeup.write(args.out, report, runs, curves, meta, recall=recall)
  print(f"wrote {os.path.join(args.out, 'README.md')} in {meta['wall_seconds'] / 60:.1f} min")
  return 0


def rewrite(args) -> int:
  """--write-only: results/README.md and the rest of the write-up again, from the earlier run's
  <out>/eval/report.json, <out>/summary.json (its meta) and <out>/recall/recall.json; nothing
  is trained or evaluated. The meta gains a note naming the commit that rewrote it."""
  from study import writeup as results_writeup
  from rove_jax.train.metrics import read_metrics
  report_path = os.path.join(args.out, "eval", "report.json")
  summary_path = os.path.join(args.out, "summary.json")
  missing = [p for p in (report_path, summary_path) if not os.path.exists(p)]
  if missing:
    raise SystemExit(f"--write-only needs an earlier run's {' and '.join(missing)}; run "
                     f"`python reproduce.py --out {args.out}` first")
  with open(report_path) as f:
    report = json.load(f)
  with open(summary_path) as f:
    meta = json.load(f)["meta"]
  runs = plan(args)
  if [r["workdir"] for r in runs] != list(meta.get("train_seconds") or {}):
    raise SystemExit(f"--write-only: the runs {[r['workdir'] for r in runs]} are not the "
                     f"earlier run's {list(meta.get('train_seconds') or {})}; give the same "
                     f"--runs-dir, --seeds and --encodings as `{meta.get('command')}`")
  recall_path = os.path.join(args.out, "recall", "recall.json")
  recall = _recall_records(recall_path) if os.path.exists(recall_path) else None
  meta.setdefault("recall_rerun", "--no-recall" not in (meta.get("command") or "").split())
  meta.setdefault("train", train_meta(args))
  lost = [r["workdir"] for r in runs
          if not os.path.exists(os.path.join(r["workdir"], "metrics.jsonl"))]
  if lost:  # the loss curves and the limits paragraph are drawn from them: refuse, lose none
    raise SystemExit(f"--write-only needs every run's metrics.jsonl for the loss curves; "
                     f"missing in {', '.join(lost)}: give the --runs-dir the runs were trained "
                     f"in (nothing was written)")
  note = f"write-up redone from the same report by `python reproduce.py --write-only` at {commit()}"
  meta["notes"] = f"{meta['notes']}; {note}" if meta.get("notes") else note
  curves = {r["workdir"]: read_metrics(r["workdir"]) for r in runs}
  results_writeup.write(args.out, report, runs, curves, meta, recall=recall)
  print(f"rewrote {os.path.join(args.out, 'README.md')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
