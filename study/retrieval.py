"""The retrieval study: train RoVE / RoPE / NoPE GPTs on synthetic associative recall at 32
tokens (study/configs/retrieval.py, rove_jax.tasks.recall) and score them at 1x..16x that
length, with and without YaRN; writes OUT/recall.json.

  python -m study.retrieval --out results/recall --runs-dir runs/recall
      [--seeds 0,1,2] [--encodings rove,rope,nope] [--nope-seeds N] [--samples 200]
      [--task mqar|lastwrite|offset] [--steps N] [--data SPEC] [--quick]

Every run trains with the same config and data; only the encoding and the seed differ. Runs
train in train.py subprocesses (`rove-train`), --jobs at a time (study.jobs); rerunning
resumes: a finished run (its workdir holds recall_study_done.json for the same settings) is
skipped, an unfinished one continues from its newest checkpoint, and the evaluation is redone.
--quick shrinks everything for tests (a 1-layer model, a few steps, 2 lengths, 8 samples).

recall.json: "records" (one per encoding, seed, setting, length: accuracy, mean answer NLL and
the per-sample lists, from rove_jax.evaluation.recall.evaluate), "sample_distance" (per length,
the query-to-pair distance of every sample; the same samples for every run), "comparisons"
(RoVE against each other encoding at every setting and length: paired bootstrap intervals over
seeds and samples from study.stats), the runs with their training times, the
spec and the wall time. recall.png: accuracy and NLL against length
(study.plots.retrieval_study).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from rove_jax.evaluation import recall, scoring
from rove_jax.nn.model_config import POS_ENCODINGS
from rove_jax.tasks import recall as recall_data
from rove_jax.train import overrides
from study import jobs, plots, stats, verdicts
from study.configs import retrieval as recall_config

DONE = "recall_study_done.json"
QUICK = {
  "model.n_layer": 1,
  "model.d_model": 32,
  "model.n_head": 2,
  "data.batch_size": 8,
  "optim.warmup_steps": 2,
  "log_every": 2,
  "eval_every": 4,
  "eval_batches": 2,
  "checkpoint_every": 4,
  "async_checkpoints": False,
}
QUICK_DOCS = {"train_docs": 200, "val_docs": 40}  # the --quick runs' data


def parse_args(argv):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--out", required=True, help="where recall.json goes")
  p.add_argument("--runs-dir", required=True, help="training workdirs (ENCODING-sSEED)")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--encodings", default="rove,rope,nope")
  p.add_argument("--samples", type=int, default=200, help="test samples per length")
  p.add_argument(
    "--multiples",
    default=",".join(map(str, recall.MULTIPLES)),
    help="test lengths as multiples of the training length",
  )
  p.add_argument("--test-seed", type=int, default=0)
  p.add_argument("--steps", type=int, help="training steps (default: study/configs/retrieval.py)")
  p.add_argument(
    "--data",
    help="the generator spec, data.path (default: "
    "study/configs/retrieval.py's); e.g. seq_len=32,pairs=4,queries=8 "
    "(rove_jax.tasks.recall.RecallSpec)",
  )
  p.add_argument(
    "--task",
    choices=sorted(recall_config.TASKS),
    help="one of study/configs/retrieval.py's TASKS: its generator spec and steps "
    "(default: the config's own, mqar); --data and --steps override them",
  )
  p.add_argument(
    "--nope-seeds", type=int, default=0, help="NoPE runs on the first N seeds only (0: all)"
  )
  p.add_argument(
    "--jobs",
    type=int,
    default=None,
    help="trainings at a time, each pinned to its own core (default: "
    "study.jobs.default_jobs(), at most 2)",
  )
  p.add_argument("--quick", action="store_true", help="tiny settings for tests")
  args = p.parse_args(argv)
  try:
    args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.multiple_list = [int(m) for m in args.multiples.split(",") if m.strip()]
  except ValueError:
    p.error("--seeds and --multiples take comma-separated integers")
  args.encoding_list = [e.strip() for e in args.encodings.split(",") if e.strip()]
  bad = [e for e in args.encoding_list if e not in POS_ENCODINGS]
  if bad or not args.encoding_list or not args.seed_list:
    p.error(f"--encodings: choose from {POS_ENCODINGS}; --seeds: at least one")
  if (
    args.steps is not None
    and args.steps < 1
    or args.samples < 1
    or not all(m >= 1 for m in args.multiple_list)
  ):
    p.error("--steps, --samples and --multiples must be >= 1")
  if args.nope_seeds < 0:
    p.error("--nope-seeds must be >= 0")
  args.task_config = {}
  if args.task is not None:
    task = recall_config.TASKS[args.task]
    args.data = task["data"] if args.data is None else args.data
    args.steps = task["steps"] if args.steps is None else args.steps
    args.task_config = dict(task.get("config", {}))
  if args.quick:
    args.multiple_list = args.multiple_list[:2]
    args.samples = min(args.samples, 8)
  return args


def plan(args) -> list[dict]:
  """Every encoding x seed, with its workdir and train.py overrides (["--config.KEY=VALUE"]).

  Every run's config (study/configs/retrieval.py with its overrides) is validated first, so a bad
  generator spec or setting is an error (ValueError) before any training starts."""
  base = dict(getattr(args, "task_config", {}))  # the task's own settings (TASKS "config")
  if args.quick:
    base.update(QUICK, steps=args.steps or 4)
  elif args.steps is not None:
    base["steps"] = args.steps
  if args.data is not None or args.quick:
    spec = args.data if args.data is not None else recall_config.get_config().data.path
    if args.quick:
      spec = dataclasses.replace(recall_data.RecallSpec.parse(spec), **QUICK_DOCS).to_string()
    base["data.path"] = spec
  runs = []
  for enc in args.encoding_list:
    seeds = args.seed_list
    if enc == "nope" and args.nope_seeds:
      seeds = seeds[: args.nope_seeds]
    for seed in seeds:
      fields = {"model.pos_encoding": enc, "seed": seed, **base}
      overrides.apply(recall_config.get_config(), [(k, str(v)) for k, v in fields.items()])
      runs.append(
        {
          "encoding": enc,
          "seed": seed,
          "overrides": [f"--config.{k}={v}" for k, v in fields.items()],
          "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}"),
        }
      )
  return runs


def _done(run) -> bool:
  path = os.path.join(run["workdir"], DONE)
  try:
    with open(path) as f:
      return json.load(f).get("overrides") == run["overrides"]
  except (OSError, ValueError):
    return False


def train_all(runs, log=print, n_jobs=None) -> None:
  """Trains each run in a subprocess, n_jobs at a time (study.jobs, each child's output in
  <workdir>/train.log), skipping finished ones; records train_seconds."""
  todo, pending = [], []
  for i, run in enumerate(runs):
    if _done(run):
      log(f"[{i + 1}/{len(runs)}] {run['encoding']} seed {run['seed']}: done, kept")
      with open(os.path.join(run["workdir"], DONE)) as f:
        run["train_seconds"] = json.load(f).get("train_seconds")
      continue
    cmd = [
      sys.executable,
      "-m",
      "rove_jax.cli.train",
      "--config",
      recall_config.__file__,
      "--workdir",
      run["workdir"],
    ] + run["overrides"]
    todo.append(
      jobs.Job(
        f"[{i + 1}/{len(runs)}] {run['encoding']} seed {run['seed']} -> {run['workdir']}",
        cmd,
        os.path.join(run["workdir"], "train.log"),
      )
    )
    pending.append(run)
  for run, (rc, secs) in zip(pending, jobs.run(todo, n_jobs, log=log)):
    if rc is None:
      continue
    run["train_seconds"] = secs
    if rc != 0:
      raise SystemExit(
        f"training {run['workdir']} failed (exit {rc}, its log: "
        f"{run['workdir']}/train.log); rerun the same command to resume it"
      )
    with open(os.path.join(run["workdir"], DONE), "w") as f:
      json.dump({"overrides": run["overrides"], "train_seconds": secs}, f)


def evaluate_all(args, runs, log=print) -> dict:
  """Scores every run on one shared test set; returns the recall.json content (no timing)."""
  records, spec, samples, train_len = [], None, None, None
  for run in runs:
    loaded = scoring.load_run(run["workdir"])
    run_spec = recall.run_spec(loaded)
    if spec is None:
      spec, train_len = run_spec, loaded.train_len
      lengths = [m * train_len for m in args.multiple_list]
      samples = recall.test_set(
        spec, lengths, args.samples, eot_id=loaded.tokenizer.eot_id, seed=args.test_seed
      )
    elif run_spec != spec or loaded.train_len != train_len:
      raise ValueError(
        f"run {run['workdir']} was trained on other data ({run_spec}) than "
        f"{runs[0]['workdir']} ({spec}); the study compares runs on one spec"
      )
    t0 = time.perf_counter()
    recs = recall.evaluate(
      scoring.Scorer(loaded), samples, encoding=run["encoding"], seed=run["seed"]
    )
    run["eval_seconds"] = time.perf_counter() - t0
    run["step"] = loaded.step
    records += recs
    log(f"scored {run['encoding']} seed {run['seed']} in {run['eval_seconds']:.0f} s")
  return {
    "spec": spec.to_string(),
    "train_len": train_len,
    "n_samples": args.samples,
    "test_seed": args.test_seed,
    "lengths": sorted(samples),
    "sample_distance": {str(L): s.distance.tolist() for L, s in sorted(samples.items())},
    "records": records,
    "comparisons": comparisons(records),
  }


def comparisons(records: list[dict], reference: str = "rove") -> list[dict]:
  """RoVE against each other encoding per (setting, length): paired bootstrap intervals of
  the accuracy and NLL differences (A = RoVE), from study.stats, with the seed-level tests
  that decide verdicts (study.verdicts: "t", "sign_flip"; None without 2 seed pairs) and the
  interval's own "direction"."""
  cells: dict = {}
  for r in records:
    cells.setdefault((r["setting"], r["length"]), {}).setdefault(r["encoding"], []).append(r)
  out = []
  for (setting, length), by_enc in sorted(cells.items()):
    if reference not in by_enc:
      continue
    for other, runs in sorted(by_enc.items()):
      if other == reference:
        continue
      row = {"setting": setting, "length": length, "a": reference, "b": other}
      a_runs = sorted(by_enc[reference], key=lambda r: r["seed"])
      b_runs = sorted(runs, key=lambda r: r["seed"])
      pair = [r["seed"] for r in a_runs] == [r["seed"] for r in b_runs]  # seed i: one pair
      for metric, field in (("accuracy", "sample_correct"), ("nll", "sample_nll")):
        c = stats.paired_difference(
          [r[field] for r in a_runs], [r[field] for r in b_runs], pair_seeds=pair
        )
        row[metric] = {
          "difference": c.estimate,
          "lower": c.lower,
          "upper": c.upper,
          "a": c.a,
          "b": c.b,
          "direction": c.direction,
          "seed_spread_included": c.seed_spread_included,
          "seeds_paired": pair,
          **verdicts.seed_tests(verdicts.comparison_diffs(c)),
        }
      out.append(row)
  return out


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  t0 = time.perf_counter()
  try:
    runs = plan(args)
  except ValueError as e:
    raise SystemExit(f"recall_study: {e}") from None
  os.makedirs(args.out, exist_ok=True)
  train_all(runs, n_jobs=args.jobs)
  t_train = time.perf_counter() - t0
  result = evaluate_all(args, runs)
  result.update(
    quick=bool(args.quick),
    train_wall_seconds=t_train,
    wall_seconds=time.perf_counter() - t0,
    runs=[
      {
        k: r.get(k)
        for k in ("encoding", "seed", "workdir", "step", "train_seconds", "eval_seconds")
      }
      for r in runs
    ],
  )
  path = os.path.join(args.out, "recall.json")
  with open(path, "w") as f:
    json.dump(result, f)
  try:  # the figure needs matplotlib; the JSON does not
    png = plots.retrieval_study(
      result["records"],
      train_lengths=[result["train_len"]],
      title=f"{args.task or 'Associative recall'} vs length (trained at "
      f"{result['train_len']} tokens)",
    )
  except ImportError:
    png = None
  if png:
    with open(os.path.join(args.out, "recall.png"), "wb") as f:
      f.write(png)
  print(recall.summary_table(result["records"]))
  pairs = recall.pair_table(result["records"])
  if pairs:
    print(pairs)
  print(f"wrote {path} in {result['wall_seconds']:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
