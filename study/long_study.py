"""The second pre-registered study (study/preregistration_long.md): RoVE against RoPE at a
longer training horizon, `make reproduce-long`.

  python -m study.long_study [--out results/long] [--runs-dir runs/long] [--jobs N]
                             [--write-only] [--status]

The model, data and evaluation are the first study's (study/configs/reproduce.py: a 4-layer
byte-level GPT, d_model 128, 2 heads of 64, 834,304 parameters, 128-token context, batch 16),
trained for STEPS steps instead of 300 (16 x 128 x 2,000 = 4.10 M tokens, 4.9 tokens per
parameter). In order, each run trained and then scored on perplexity (the first study's
evaluation: 16,384 tokens a length, 0.5x-16x the training length, without YaRN and with YaRN
at factor L / T), two at a time, each on its own core:

  sweep    RoVE and RoPE at SWEEP_LRS on SWEEP_SEEDS; each encoding's rate is the one of
           lowest mean final held-out loss (study/sweep.py's rule) and must lie strictly
           inside its grid: a best rate at an edge extends that encoding's grid by one rate
           2x past the edge (the same seeds), at most MAX_EXTENSIONS times, after which the
           command stops and no comparison run trains. results/long/lr_sweep.md is written
           before any comparison run trains.
  primary  RoVE and RoPE at their chosen rates on SEEDS (10 fresh seed pairs), pair by pair.

The sweep's runs at the rates next to the chosen one are the rate-sensitivity rows
(exploratory). NoPE is not trained (the preregistration drops it from every comparison).
Every run is a child process at the lowest priority (os.nice 19, inherited by the children),
so the study yields the CPU to other work; rerunning resumes: train.py continues a run from its
newest checkpoint (every 200 steps) or skips a finished one, and a run whose perplexity report
is already in <out>/reports/ is not evaluated again. The write-up (study/long_writeup.py) is
redone from <out>/reports/ and the runs' metrics.jsonl at every invocation; before every
primary pair is evaluated it reports progress only, never a verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

from study import jobs, sweep
from study.long_plan import (  # noqa: F401
  CHECKPOINT_EVERY,
  CONFIG,
  ENCODINGS,
  EVAL_EVERY,
  MAX_EXTENSIONS,
  MIN_RATES,
  MIN_SEEDS,
  PPL_TOKENS,
  ROOT,
  RULE,
  SEEDS,
  STEPS,
  SWEEP_LRS,
  SWEEP_SEEDS,
  metrics_path,
  name,
  primary_plan,
  report_path,
  status,
  sweep_plan,
)
from study.recall_runs import _env


def parse_args(argv):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--out", default="results/long", help="lr_sweep.md, reports/, README.md")
  p.add_argument("--runs-dir", default="runs/long", help="training workdirs")
  p.add_argument(
    "--jobs",
    type=int,
    default=None,
    help="runs at a time, each pinned to its own core (default: study.jobs)",
  )
  p.add_argument(
    "--write-only",
    action="store_true",
    help="train nothing: redo the write-up from <out>/reports/ and the runs",
  )
  p.add_argument(
    "--status", action="store_true", help="print how many runs are trained and evaluated, and exit"
  )
  return p.parse_args(argv)


def curve(run: dict, out: str) -> list[dict]:
  """A run's metrics rows: its copy in <out>/metrics/ (a finished run's), else its workdir's."""
  from rove_jax.train.metrics import read_metrics

  path = metrics_path(out, run)
  if os.path.exists(path):
    with open(path) as f:
      return [json.loads(line) for line in f if line.strip()]
  return read_metrics(run["workdir"])


def finite(run: dict, out: str) -> bool:
  """Whether the run's final held-out loss is finite (a diverged run's pair is replaced)."""
  import math

  loss = sweep.final_val_loss(curve(run, out))
  return loss is not None and math.isfinite(loss)


def overrides(run: dict) -> list[str]:
  return [
    f"--config.model.pos_encoding={run['encoding']}",
    f"--config.seed={run['seed']}",
    f"--config.optim.lr={run['lr']}",
    f"--config.steps={STEPS}",
    f"--config.eval_every={EVAL_EVERY}",
    f"--config.checkpoint_every={CHECKPOINT_EVERY}",
  ]


def commands(run: dict, out: str) -> tuple[list, list]:
  """(the training command, the evaluation command) of a run."""
  train = [
    sys.executable,
    os.path.join(ROOT, "train.py"),
    "--config",
    CONFIG,
    "--workdir",
    run["workdir"],
    *overrides(run),
  ]
  evaluate = [
    sys.executable,
    "-m",
    "rove_jax.cli.eval",
    "--workdir",
    run["workdir"],
    "--tasks",
    "ppl",
    "--suite",
    "full",
    "--yarn",
    "both",
    "--ppl-tokens",
    str(PPL_TOKENS),
    "--no-progress",
    "--out",
    os.path.join(run["workdir"], "eval"),
  ]
  return train, evaluate


def job(run: dict, out: str, label: str) -> jobs.Job:
  """One child: unless <out>/reports/ has the run's report (the mark of a finished run, even
  in a checkout without the workdirs), train (resuming), evaluate, and copy the run's
  metrics.jsonl into <out>/metrics/ and then its report into <out>/reports/ (the committed
  records the write-up reads). A shell chain, so that a run's evaluation follows its training
  on the same core while the other core trains."""
  train, evaluate = commands(run, out)
  dest, q = report_path(out, run), shlex.quote
  copies = [
    (os.path.join(run["workdir"], "metrics.jsonl"), metrics_path(out, run)),
    (os.path.join(run["workdir"], "eval", "report.json"), dest),
  ]  # the report last
  chain = (
    f"if [ ! -f {q(dest)} ]; then {shlex.join(train)} && {shlex.join(evaluate)}"
    + "".join(
      f" && mkdir -p {q(os.path.dirname(b))} && cp {q(a)} {q(b)}.tmp && mv {q(b)}.tmp {q(b)}"
      for a, b in copies
    )
    + "; fi"
  )
  return jobs.Job(
    label, ["/bin/sh", "-c", chain], os.path.join(run["workdir"], "train.log"), _env()
  )


def run_all(runs: list, out: str, n_jobs, what: str, mark=None) -> None:
  """Trains and evaluates `runs` (finished ones are skipped); as each child ends, records its
  seconds in <out>/timings.json and calls `mark` (the invocation's clock); stops the command
  on a failure (a rerun resumes)."""
  todo = [job(r, out, f"[{what} {i + 1}/{len(runs)}] {name(r)}") for i, r in enumerate(runs)]
  fresh = [not os.path.exists(report_path(out, r)) for r in runs]  # not finished before
  path = os.path.join(out, "timings.json")

  def done(i, rc, secs):
    if rc == 0 and fresh[i]:  # a run skipped as finished adds nothing
      timings = _read(path) or {}
      timings.setdefault(f"{runs[i]['kind']}-{name(runs[i])}", []).append(round(secs, 1))
      _write(path, timings)
    if mark is not None:
      mark()

  results = jobs.run(todo, n_jobs, log=_say, on_done=done)
  for r, (rc, _) in zip(runs, results):
    if rc not in (0, None):
      raise SystemExit(
        f"{name(r)} failed (exit {rc}; its log: {r['workdir']}/train.log); "
        f"rerun `make reproduce-long` to resume"
      )


def _say(line: str) -> None:
  print(line, flush=True)


def _read(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write(path: str, data) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=1)
  os.replace(path + ".tmp", path)


def extend(grid: list, by_rate: dict) -> list:
  """The grid with one rate 2x past the end its best rate (lowest mean loss) lies at."""
  best = min(by_rate, key=lambda lr: sum(by_rate[lr]) / len(by_rate[lr]))
  return sorted(grid + ([best / 2] if best == min(grid) else [best * 2]))


def tune(runs_dir: str, out: str, n_jobs, meta: dict, train=None, mark=None) -> dict:
  """The sweep with its extensions (module docstring); returns {encoding: chosen rate} after
  writing <out>/lr_sweep.md, or stops the command when a grid is still refused after
  MAX_EXTENSIONS extensions. `train` (runs -> None) replaces run_all in tests."""
  train = train or (lambda runs: run_all(runs, out, n_jobs, "sweep", mark))
  grids = {enc: list(SWEEP_LRS) for enc in ENCODINGS}
  for attempt in range(MAX_EXTENSIONS + 1):
    runs = sweep_plan(grids, runs_dir)
    train(runs)
    table = sweep.losses(runs, {r["workdir"]: curve(r, out) for r in runs})
    chosen, refused = sweep.decide(table, MIN_RATES)
    sweep.write(
      out,
      table,
      SWEEP_SEEDS,
      chosen,
      refused,
      dict(
        meta,
        rule=RULE,
        extensions=attempt,
        grids={e: [f"{x:g}" for x in g] for e, g in grids.items()},
      ),
    )
    if not refused:
      return chosen
    if attempt == MAX_EXTENSIONS:
      raise SystemExit(
        f"the sweep's best rate is still at its grid's edge after "
        f"{MAX_EXTENSIONS} extensions ({', '.join(refused)}): the study stops "
        f"here, as registered; no comparison run trains"
      )
    for enc in refused:
      grids[enc] = extend(grids[enc], table[enc])
      _say(
        f"{enc}: best rate at the grid's edge; grid extended to "
        f"{', '.join(f'{x:g}' for x in grids[enc])}"
      )
  raise AssertionError("unreachable")


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.status:
    for k, (done, n) in status(args.out, args.runs_dir).items():
      print(f"{k}: {done} of {n} runs trained and evaluated")
    return 0
  if args.write_only:
    from study import long_writeup

    print(f"wrote {long_writeup.write(args.out, args.runs_dir)}")
    return 0
  os.nice(max(0, 19 - os.nice(0)))  # the lowest priority, for this process and its children
  from study.checkout import git_commit

  os.makedirs(args.out, exist_ok=True)
  t0 = time.time()
  meta = {"command": "make reproduce-long", "commit": git_commit(), "steps": STEPS}
  mark = invocation(args.out, meta["commit"])
  rates = tune(args.runs_dir, args.out, args.jobs, meta, mark=mark)
  _write_up(args)  # progress so far, before the pairs train
  good, seed = 0, SEEDS[0]
  while good < len(SEEDS):  # pair by pair: a finished pair is a complete record
    pair = primary_plan(rates, args.runs_dir, [seed])
    run_all(pair, args.out, args.jobs, f"seed {seed}, pair {good + 1}/{len(SEEDS)}", mark)
    if all(finite(r, args.out) for r in pair):
      good += 1
    else:  # the preregistration's rule: the pair leaves, the next unused seed replaces it
      _say(
        f"seed {seed}: a run diverged (final held-out loss not finite); seed {seed + 1} "
        f"replaces the pair"
      )
    seed += 1
    _write_up(args)
  _say(f"done in {(time.time() - t0) / 60:.1f} min (this invocation)")
  return 0


def invocation(out: str, commit: str):
  """Records this invocation in <out>/invocations.json ({started, until, commit}, times in
  seconds since the epoch) and returns a function that moves its "until" to now: the study's
  wall time is the sum of until - started (an invocation cut off by the machine counts up to
  its last finished stage)."""
  path = os.path.join(out, "invocations.json")
  mine = {"started": round(time.time()), "until": round(time.time()), "commit": commit}
  _write(path, (_read(path) or []) + [mine])

  def mark():  # the file as it is now (a note added beside the run is kept), this entry moved
    records = _read(path) or []
    for r in records:
      if r.get("started") == mine["started"] and r.get("commit") == commit:
        r["until"] = round(time.time())
    _write(path, records)

  return mark


def _write_up(args) -> None:
  """The write-up from what is there; a failure of it is printed and training goes on (the
  write-up is redone at every invocation, and by --write-only)."""
  from study import long_writeup

  try:
    _say(f"wrote {long_writeup.write(args.out, args.runs_dir)}")
  except Exception as e:  # noqa: BLE001 - the runs matter more than an interim page
    _say(
      f"the write-up failed ({type(e).__name__}: {e}); training goes on, and "
      f"`python -m study.long_study --write-only` redoes it"
    )


if __name__ == "__main__":
  sys.exit(main())
