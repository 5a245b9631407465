"""study/long_study.py (make reproduce-long): the plan, the sweep's rule with its extensions,
the resumable child commands; nothing is trained here."""

import json
import math
import os
import shutil

import pytest

from study import long_study as ls
from study import sweep


def _fake_sweep(best, calls):
  """tune's `train` stand-in: every sweep run gets a final held-out loss lowest at
  best[encoding], rising with the log-distance from it."""

  def train(runs):
    calls.append(sorted({(r["encoding"], r["lr"]) for r in runs}))
    for r in runs:
      os.makedirs(r["workdir"], exist_ok=True)
      loss = 2.0 + 0.1 * abs(math.log2(r["lr"] / best[r["encoding"]])) + 0.01 * r["seed"]
      with open(os.path.join(r["workdir"], "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": ls.STEPS, "val_loss": loss}) + "\n")

  return train


def test_the_plan_is_ten_fresh_pairs_at_the_chosen_rates():
  runs = ls.primary_plan({"rove": 4e-3, "rope": 2e-3}, "r")
  assert len(runs) == 20 and [r["seed"] for r in runs[:4]] == [10, 10, 11, 11]
  assert [r["encoding"] for r in runs[:2]] == ["rove", "rope"]  # pair by pair
  assert {r["lr"] for r in runs if r["encoding"] == "rope"} == {2e-3}
  seeds = {r["seed"] for r in runs}
  assert seeds.isdisjoint(ls.SWEEP_SEEDS) and seeds.isdisjoint(range(8))  # the first study's
  assert seeds.isdisjoint({100, 101, 102, 900})  # the first sweep's and the timing pair's
  sw = ls.sweep_plan({e: list(ls.SWEEP_LRS) for e in ls.ENCODINGS}, "r")
  assert len(sw) == 2 * 3 * 2 and all("/sweep/" in r["workdir"] for r in sw)
  o = ls.overrides(runs[0])
  assert "--config.steps=2000" in o and "--config.optim.lr=0.004" in o
  assert "--config.eval_every=200" in o and "--config.seed=10" in o


def test_an_interior_best_is_chosen_and_written_before_the_comparison(tmp_path):
  calls = []
  chosen = ls.tune(
    str(tmp_path / "runs"),
    str(tmp_path / "out"),
    1,
    {"steps": ls.STEPS},
    train=_fake_sweep({"rove": 4e-3, "rope": 4e-3}, calls),
  )
  assert chosen == {"rove": 4e-3, "rope": 4e-3} and len(calls) == 1
  md = (tmp_path / "out" / sweep.MD).read_text()
  assert "| rove | 0.004 (chosen) |" in md and ls.RULE in md
  assert ls.status(str(tmp_path / "out"), str(tmp_path / "runs")) == {
    "sweep": (0, 12),
    "primary": (0, 20),
  }
  # a checkout with the committed metrics copies and no workdirs decides the same
  for r in ls.sweep_plan({e: list(ls.SWEEP_LRS) for e in ls.ENCODINGS}, str(tmp_path / "runs")):
    os.makedirs(os.path.dirname(ls.metrics_path(str(tmp_path / "out"), r)), exist_ok=True)
    shutil.copy(
      os.path.join(r["workdir"], "metrics.jsonl"), ls.metrics_path(str(tmp_path / "out"), r)
    )
  shutil.rmtree(tmp_path / "runs")
  assert (
    ls.tune(
      str(tmp_path / "runs"), str(tmp_path / "out"), 1, {"steps": ls.STEPS}, train=lambda runs: None
    )
    == chosen
  )


def test_a_resumed_invocation_keeps_the_commit_that_made_the_decision(tmp_path):
  """The sweep's record says which commit chose the rates, before any comparison run: an
  invocation that resumes the study on later code decides the same and must not restamp it."""
  out, runs = str(tmp_path / "out"), str(tmp_path / "runs")
  fake = _fake_sweep({"rove": 4e-3, "rope": 4e-3}, [])
  ls.tune(runs, out, 1, {"steps": ls.STEPS, "commit": "a" * 40}, train=fake)
  ls.tune(runs, out, 1, {"steps": ls.STEPS, "commit": "b" * 40}, train=lambda r: None)
  assert sweep.load_record(out)["meta"]["commit"] == "a" * 40
  assert "a" * 40 in (tmp_path / "out" / sweep.MD).read_text()
  # another decision (other losses) is written, with its own commit
  ls.tune(
    runs,
    out,
    1,
    {"steps": ls.STEPS, "commit": "c" * 40},
    train=_fake_sweep({"rove": 4e-3, "rope": 2e-3}, []),
  )
  assert sweep.load_record(out)["meta"]["commit"] == "c" * 40


def test_an_edge_best_extends_that_grid_and_stops_after_two_extensions(tmp_path):
  calls = []
  chosen = ls.tune(
    str(tmp_path / "runs"),
    str(tmp_path / "out"),
    1,
    {"steps": ls.STEPS},
    train=_fake_sweep({"rove": 4e-3, "rope": 1.1e-2}, calls),
  )
  assert chosen == {"rove": 4e-3, "rope": 8e-3}
  assert ("rope", 1.6e-2) in calls[1] and ("rove", 1.6e-2) not in calls[1]
  rec = sweep.load_record(str(tmp_path / "out"))
  assert rec["meta"]["extensions"] == 1 and rec["meta"]["grids"]["rope"][-1] == "0.016"
  calls = []
  with pytest.raises(SystemExit, match="still at its grid's edge after 2 extensions"):
    ls.tune(
      str(tmp_path / "r2"),
      str(tmp_path / "o2"),
      1,
      {"steps": ls.STEPS},
      train=_fake_sweep({"rove": 4e-3, "rope": 1e-4}, calls),
    )
  assert len(calls) == 3 and ("rope", 5e-4) in calls[-1]


def test_a_child_trains_then_evaluates_once_into_reports(tmp_path):
  run = ls.primary_plan({"rove": 4e-3, "rope": 4e-3}, str(tmp_path))[0]
  job = ls.job(run, str(tmp_path / "out"), "x")
  chain = job.cmd[-1]
  dest = ls.report_path(str(tmp_path / "out"), run)
  assert chain.startswith(f"if [ ! -f {dest} ]; then ")  # a finished run is not asked again
  assert chain.index("train.py") < chain.index("rove_jax.cli.eval") < chain.index(" cp ")
  assert chain.rindex(f"mv {dest}.tmp {dest}") > chain.index("metrics.jsonl")  # report last
  assert "--yarn both" in chain and "--ppl-tokens 16384" in chain and "--tasks ppl" in chain
  assert job.log == os.path.join(run["workdir"], "train.log")


LENGTHS = (64, 128, 256, 512, 1024, 2048)


def _fake_records(out, run, rng, gap=-0.02, windows=4):
  """A run's committed records as the job leaves them: reports/KEY.json (perplexity cells with
  per-window NLLs; RoVE `gap` nats lower and degrading 0.8x as fast past T) and
  metrics/KEY.jsonl (held-out loss every 200 steps)."""
  enc, key = run["encoding"], f"{run['kind']}-{ls.name(run)}"
  base = 1.5 + 0.01 * run["seed"] % 0.07  # shared by the pair
  ppl = {}
  for s in ("none", "yarn"):
    ppl[s] = {}
    for L in LENGTHS:
      growth = 0.1 * max(0.0, math.log2(L / 128)) * (0.5 if s == "yarn" else 1.0)
      mean = base + growth * (0.8 if enc == "rove" else 1.0) + (gap if enc == "rove" else 0)
      losses = mean + 0.005 * rng.standard_normal(windows)
      ppl[s][str(L)] = {
        "loss": float(losses.mean()),
        "window_nll": (losses * L).tolist(),
        "window_tokens": [L] * windows,
      }
  entry = {
    "name": ls.name(run),
    "workdir": run["workdir"],
    "step": ls.STEPS,
    "model": {"pos_encoding": enc, "train_len": 128},
    "perplexity": ppl,
  }
  for sub, text in (
    ("reports", json.dumps({"runs": [entry]})),
    (
      "metrics",
      "".join(
        json.dumps(
          {"step": s, "val_loss": base + 100 / s + (gap * 1000 / s if enc == "rove" else 0)}
        )
        + "\n"
        for s in range(200, ls.STEPS + 1, 200)
      ),
    ),
  ):
    os.makedirs(os.path.join(out, sub), exist_ok=True)
    ext = ".json" if sub == "reports" else ".jsonl"
    with open(os.path.join(out, sub, key + ext), "w") as f:
      f.write(text)


def _fake_study(tmp_path, pairs):
  """results/long as the command leaves it after the sweep and `pairs` primary pairs."""
  import numpy as np

  rng = np.random.default_rng(0)
  out, runs_dir = str(tmp_path / "out"), str(tmp_path / "runs")
  sweep_train = _fake_sweep({"rove": 4e-3, "rope": 4e-3}, [])

  def train(runs):
    sweep_train(runs)
    for r in runs:
      _fake_records(out, r, rng)
      shutil.copy(os.path.join(r["workdir"], "metrics.jsonl"), ls.metrics_path(out, r))

  chosen = ls.tune(runs_dir, out, 1, {"steps": ls.STEPS, "commit": "abc"}, train=train)
  for r in ls.primary_plan(chosen, runs_dir)[: 2 * pairs]:
    _fake_records(out, r, rng)
  return out, runs_dir


def test_the_write_up_shows_no_comparison_number_before_all_ten_pairs(tmp_path):
  from study import long_writeup

  out, runs_dir = _fake_study(tmp_path, 9)
  text = open(long_writeup.write(out, runs_dir)).read()
  assert "(in progress)" in text and "primary: 18 of 20 runs" in text
  assert "## Primary family" not in text and "P1" not in text
  assert "## Rate sensitivity (exploratory)" in text  # the sweep's own runs, 3 rates
  assert "| primary-rove-s10-lr0.004 | primary | RoVE | 10 | 0.004 | - |" in text


def test_the_complete_study_gives_the_registered_family(tmp_path):
  from study import long_rows as lr
  from study import long_writeup

  out, runs_dir = _fake_study(tmp_path, 10)
  text = open(long_writeup.write(out, runs_dir)).read()
  assert "(in progress)" not in text and "## Primary family (Holm over 7 rows)" in text
  assert os.path.exists(os.path.join(out, long_writeup.PLOT))
  runs = lr.load(out)
  st = lr.study(runs, "primary", {"rove": 4e-3, "rope": 4e-3}, list(ls.SEEDS))
  fam = {r["id"]: r for r in lr.adjust(lr.family(st))}
  assert list(fam) == ["P1", "P2", "P3", "P4", "P5", "P6", "P7"]
  # P1's pair differences are the runs' token-weighted losses at T, RoVE - RoPE
  cell = {
    (r["encoding"], r["seed"]): r["report"]["perplexity"]["none"]["128"]["loss"]
    for r in runs
    if r["kind"] == "primary"
  }
  diffs = [cell["rove", s] - cell["rope", s] for s in ls.SEEDS]
  assert fam["P1"]["tost"]["mean"] == pytest.approx(sum(diffs) / 10)
  assert fam["P1"]["verdict"] == "RoVE better (beyond -1 %)"  # a -2 % gap, little noise
  assert fam["P5"]["verdict"] == fam["P6"]["verdict"] == "degrades"
  assert fam["P7"]["verdict"] == "supports" and fam["P4"]["verdict"] == "supports"
  assert {r["holm_m"] for r in fam.values()} == {7}
  share = lr.yarn_share(st)  # the fake runs: RoVE degrades 0.8x as fast, YaRN halves both
  assert list(share) == [256, 512, 1024, 2048] and 0.4 < share[2048] < 0.7
  assert "How much of the gap YaRN keeps" in text


def test_a_diverged_run_takes_its_pair_out_of_the_family(tmp_path):
  from study import long_rows as lr
  from study import long_writeup

  out, runs_dir = _fake_study(tmp_path, 10)
  path = os.path.join(out, "metrics", "primary-rope-s13-lr0.004.jsonl")
  with open(path, "a") as f:
    f.write(json.dumps({"step": ls.STEPS + 1, "val_loss": float("nan")}) + "\n")
  runs = lr.load(out)
  assert 13 not in lr.complete_pairs(runs, "primary", {"rove": 4e-3, "rope": 4e-3})
  assert "(in progress)" in open(long_writeup.write(out, runs_dir)).read()


def test_an_invocation_moves_its_own_clock_and_keeps_the_others(tmp_path):
  out = str(tmp_path)
  with open(os.path.join(out, "invocations.json"), "w") as f:
    json.dump([{"started": 1, "until": 5, "commit": "a", "note": "by hand"}], f)
  mark = ls.invocation(out, "b")
  with open(os.path.join(out, "invocations.json")) as f:
    records = json.load(f)
  records[0]["until"] = 7  # edited while this invocation runs
  with open(os.path.join(out, "invocations.json"), "w") as f:
    json.dump(records, f)
  mark()
  with open(os.path.join(out, "invocations.json")) as f:
    records = json.load(f)
  assert records[0] == {"started": 1, "until": 7, "commit": "a", "note": "by hand"}
  assert records[1]["commit"] == "b" and records[1]["until"] >= records[1]["started"]
