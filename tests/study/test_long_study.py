"""study/long_study.py (make reproduce-long): the plan, the sweep's rule with its extensions,
the resumable child commands; nothing is trained here."""

import json
import math
import os

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
  chosen = ls.tune(str(tmp_path / "runs"), str(tmp_path / "out"), 1, {"steps": ls.STEPS},
                   train=_fake_sweep({"rove": 4e-3, "rope": 4e-3}, calls))
  assert chosen == {"rove": 4e-3, "rope": 4e-3} and len(calls) == 1
  md = (tmp_path / "out" / sweep.MD).read_text()
  assert "| rove | 0.004 (chosen) |" in md and ls.RULE in md
  assert ls.status(str(tmp_path / "out"), str(tmp_path / "runs")) == {
      "sweep": (0, 12), "primary": (0, 20)}


def test_an_edge_best_extends_that_grid_and_stops_after_two_extensions(tmp_path):
  calls = []
  chosen = ls.tune(str(tmp_path / "runs"), str(tmp_path / "out"), 1, {"steps": ls.STEPS},
                   train=_fake_sweep({"rove": 4e-3, "rope": 1.1e-2}, calls))
  assert chosen == {"rove": 4e-3, "rope": 8e-3}
  assert ("rope", 1.6e-2) in calls[1] and ("rove", 1.6e-2) not in calls[1]
  rec = sweep.load_record(str(tmp_path / "out"))
  assert rec["meta"]["extensions"] == 1 and rec["meta"]["grids"]["rope"][-1] == "0.016"
  calls = []
  with pytest.raises(SystemExit, match="still at its grid's edge after 2 extensions"):
    ls.tune(str(tmp_path / "r2"), str(tmp_path / "o2"), 1, {"steps": ls.STEPS},
            train=_fake_sweep({"rove": 4e-3, "rope": 1e-4}, calls))
  assert len(calls) == 3 and ("rope", 5e-4) in calls[-1]


def test_a_child_trains_then_evaluates_once_into_reports(tmp_path):
  run = ls.primary_plan({"rove": 4e-3, "rope": 4e-3}, str(tmp_path))[0]
  job = ls.job(run, str(tmp_path / "out"), "x")
  chain = job.cmd[-1]
  assert chain.index("train.py") < chain.index("rove_jax.cli.eval") < chain.index(" cp ")
  assert "--yarn both" in chain and "--ppl-tokens 16384" in chain and "--tasks ppl" in chain
  assert f"if [ ! -f {ls.report_path(str(tmp_path / 'out'), run)} ]" in chain
  assert job.log == os.path.join(run["workdir"], "train.log")
