"""study/sweep.py and reproduce.py --sweep-lrs: the choice rule, the plan, and the order (the
sweep's table is written before any comparison run trains); nothing is trained here."""

import json
import os

import pytest

import reproduce
from study import sweep

GRID = (5e-4, 1e-3, 2e-3, 4e-3)


def _losses(best, grid=GRID, seeds=3):
  """{lr: per-seed losses}: lowest mean at `best`, rising with the log-distance from it."""
  import math

  return {
    lr: [2.0 + 0.1 * abs(math.log2(lr / best)) + 0.01 * s for s in range(seeds)] for lr in grid
  }


def test_the_rule_picks_the_interior_best_and_refuses_an_edge():
  assert sweep.choose(_losses(2e-3)) == 2e-3
  assert sweep.choose(_losses(1e-3)) == 1e-3
  with pytest.raises(sweep.EdgeError, match=r"0\.004 .* is the largest of the grid .*Extend"):
    sweep.choose(_losses(4e-3), "the rove sweep")
  with pytest.raises(sweep.EdgeError, match=r"0\.0005 .* is the smallest of the grid"):
    sweep.choose(_losses(5e-4))
  # beyond the grid: the nearest end is best, which the rule refuses
  with pytest.raises(sweep.EdgeError, match="add 0.008"):
    sweep.choose(_losses(1.6e-2))
  with pytest.raises(ValueError, match="at least 4"):
    sweep.choose(_losses(1e-3, GRID[:3]))
  chosen, refused = sweep.decide({"rove": _losses(2e-3), "rope": _losses(4e-3)})
  assert chosen == {"rove": 2e-3} and list(refused) == ["rope"]


def test_grids_need_four_rates_and_three_seeds():
  sweep.check_grid(GRID, [100, 101, 102])
  with pytest.raises(ValueError, match="at least 4 distinct learning rates"):
    sweep.check_grid(GRID[:3], [100, 101, 102])
  with pytest.raises(ValueError, match="at least 3 distinct seeds"):
    sweep.check_grid(GRID, [100, 101])
  with pytest.raises(ValueError, match="distinct learning rates"):
    sweep.check_grid(GRID[:3] + (GRID[0],), [1, 2, 3])
  assert sweep.parse_rates("4e-3,1e-3,2e-3,5e-4", ["rove", "rope"]) == {
    "rove": sorted(GRID),
    "rope": sorted(GRID),
  }
  assert sweep.parse_rates("rove=1e-3,2e-3;rope=3e-3", ["rove", "rope"]) == {
    "rove": [1e-3, 2e-3],
    "rope": [3e-3],
  }
  with pytest.raises(ValueError, match="'nope' is not one of"):
    sweep.parse_rates("nope=1e-3", ["rove", "rope"])
  with pytest.raises(ValueError, match="also comparison --seeds"):
    sweep.from_flags("5e-4,1e-3,2e-3,4e-3", "0,100,101", ["rove", "rope"], [0, 1])


def test_the_plan_tunes_the_rotary_encodings_and_keeps_the_comparison_seeds_fresh():
  args = reproduce.parse_args(
    [
      "--sweep-lrs",
      "5e-4,1e-3,2e-3,4e-3",
      "--seeds",
      "0,1,2,3",
      "--long-seeds",
      "3",
      "--long-multiple",
      "3",
      "--steps",
      "10",
      "--runs-dir",
      "r",
    ]
  )
  assert args.sweep_grids == {"rove": sorted(GRID), "rope": sorted(GRID)}
  assert args.lr_list == []  # the sweep replaces the --lrs check
  runs = sweep.plan(args.sweep_grids, args.sweep_seed_list, args.runs_dir)
  assert len(runs) == 2 * len(GRID) * len(args.sweep_seed_list)
  assert len({r["workdir"] for r in runs}) == len(runs)
  assert {r["seed"] for r in runs}.isdisjoint(args.seed_list)
  rates = {"rove": 2e-3, "rope": 1e-3}
  tuned = reproduce.plan(args, rates)
  for r in tuned:
    if r["encoding"] == "nope":
      assert "lr" not in r and "-lr" not in os.path.basename(r["workdir"])
    else:
      assert r["lr"] == rates[r["encoding"]] and r["workdir"].endswith(f"-lr{r['lr']:g}")
      assert f"--config.optim.lr={r['lr']}" in reproduce.overrides(args, r)
  main = [r for r in tuned if r["kind"] == "main" and r["encoding"] != "nope"]
  long = [r for r in tuned if r["kind"] == "long"]
  assert len(main) == 2 * 4 and len(long) == 2 * 3 and {r["steps"] for r in long} == {30}
  assert not [r for r in tuned if r["kind"] == "lr"]
  with pytest.raises(SystemExit):
    reproduce.parse_args(["--sweep-lrs", "1e-3,2e-3,4e-3"])  # 3 rates


def _fake_training(best, calls, out):
  """train_all's stand-in: sweep runs get metrics whose best rate is `best[encoding]`; any
  other run records whether lr_sweep.md existed when it was asked to train, then stops."""

  def train_all(args, runs):
    if all(r["kind"] == "sweep" for r in runs):
      for r in runs:
        os.makedirs(r["workdir"], exist_ok=True)
        loss = _losses(best[r["encoding"]])[r["lr"]][r["seed"] - 100]
        with open(os.path.join(r["workdir"], "metrics.jsonl"), "w") as f:
          f.write(json.dumps({"step": 10, "val_loss": loss}) + "\n")
      calls.append(("sweep", len(runs)))
      return
    calls.append(
      (
        "comparison",
        os.path.exists(out / sweep.MD),
        sorted({(r["encoding"], r.get("lr")) for r in runs}),
      )
    )
    raise KeyboardInterrupt  # the test stops before the evaluation

  return train_all


def _faked_command(tmp_path, monkeypatch, best, seeds="0"):
  """(out dir, calls, argv): train_all faked by `_fake_training(best)` and the reproduce.py
  command line of a 4-rate sweep over `seeds`, RoVE and RoPE, 10 steps, under tmp_path."""
  out, calls = tmp_path / "out", []
  monkeypatch.setattr(reproduce, "train_all", _fake_training(best, calls, out))
  argv = [
    "--sweep-lrs",
    "5e-4,1e-3,2e-3,4e-3",
    "--seeds",
    seeds,
    "--encodings",
    "rove,rope",
    "--steps",
    "10",
    "--out",
    str(out),
    "--runs-dir",
    str(tmp_path / "runs"),
  ]
  return out, calls, argv


def test_the_sweep_table_is_written_before_the_comparison_trains(tmp_path, monkeypatch):
  out, calls, argv = _faked_command(
    tmp_path, monkeypatch, {"rove": 2e-3, "rope": 1e-3}, seeds="0,1"
  )
  with pytest.raises(KeyboardInterrupt):
    reproduce.main(argv)
  assert calls[0] == ("sweep", 2 * 4 * 3)
  assert calls[1] == ("comparison", True, [("rope", 1e-3), ("rove", 2e-3)])
  md = (out / sweep.MD).read_text()
  assert sweep.RULE in md
  assert "| rove | 0.002 (chosen) |" in md and "| rope | 0.001 (chosen) |" in md
  assert sweep.load_choice(str(out)) == {"rove": 2e-3, "rope": 1e-3}
  # --write-only plans the same runs from the choice the sweep recorded
  args = reproduce.parse_args(argv + ["--write-only"])
  assert reproduce.plan(args, reproduce._sweep_choice(args)) == reproduce.plan(
    args, {"rove": 2e-3, "rope": 1e-3}
  )


def test_an_edge_best_stops_the_command_before_the_comparison(tmp_path, monkeypatch):
  out, calls, argv = _faked_command(tmp_path, monkeypatch, {"rove": 2e-3, "rope": 4e-3})
  with pytest.raises(SystemExit, match="rope sweep: the best learning rate 0.004"):
    reproduce.main(argv)
  assert [c[0] for c in calls] == ["sweep"]  # no comparison run trained
  md = (out / sweep.MD).read_text()
  assert "- rope: refused." in md and "- rove: 0.002, strictly inside its grid" in md
  with pytest.raises(SystemExit, match="chose no rate"):
    sweep.load_choice(str(out))


def test_a_recorded_sweep_is_not_trained_again(tmp_path, monkeypatch):
  """A second run of the same command with --reuse-sweep (the sweep committed in results/, its
  runs gone) reuses the recorded choice and trains only the comparison; without the flag, or
  with another grid, seed list or step count, the sweep trains again."""
  out, calls, argv = _faked_command(tmp_path, monkeypatch, {"rove": 2e-3, "rope": 1e-3})
  with pytest.raises(KeyboardInterrupt):
    reproduce.main(argv)
  table = (out / sweep.MD).read_text()
  calls.clear()
  with pytest.raises(KeyboardInterrupt):
    reproduce.main(argv + ["--reuse-sweep"])
  assert calls == [("comparison", True, [("rope", 1e-3), ("rove", 2e-3)])]
  assert (out / sweep.MD).read_text() == table  # kept as written
  calls.clear()
  with pytest.raises(KeyboardInterrupt):
    reproduce.main(argv)  # a full rerun trains (here: resumes) the sweep again
  assert calls[0] == ("sweep", 2 * 4 * 3)
  grids = {"rove": list(GRID), "rope": list(GRID)}
  assert sweep.recorded(str(out), grids, [100, 101, 102], 10) == {"rove": 2e-3, "rope": 1e-3}
  assert sweep.recorded(str(out), grids, [100, 101, 102], 20) is None
  assert sweep.recorded(str(out), grids, [100, 101], 10) is None
  assert (
    sweep.recorded(str(out), {**grids, "rope": list(GRID) + [8e-3]}, [100, 101, 102], 10) is None
  )


def test_the_write_up_shows_the_sweep_and_names_the_preregistration(tmp_path, monkeypatch):
  from study import run_info

  out, _, argv = _faked_command(tmp_path, monkeypatch, {"rove": 2e-3, "rope": 1e-3})
  argv.append("--sweep-only")
  assert reproduce.main(argv) == 0
  md = "\n".join(sweep.section(sweep.load_record(str(out))))
  assert md.startswith("## Learning-rate sweep") and sweep.RULE in md
  assert "| rove | 0.002 (chosen) | 2.0100 | 2.0000, 2.0100, 2.0200 |" in md
  assert "| rope | 0.0005 | 2.1100 |" in md and "- rope: 0.001, strictly inside its grid" in md
  assert sweep.section(None) == []
  monkeypatch.setattr(run_info, "preregistration", lambda: ("abc", "2026-12-04T13:40:00+00:00"))
  lines = lambda started: [
    l
    for l in run_info.header(
      _Study(),
      {  # noqa: E731
        "command": "c",
        "commit": "x",
        "machine": "m",
        "started": started,
        "wall_seconds": 60,
        "lr_sweep": {"chosen": {"rove": 2e-3}, "file": sweep.MD},
      },
    )
    if "Pre-registration" in l
  ]
  assert (
    "in abc at 2026-12-04T13:40:00+00:00, before this run" in lines("2026-12-04T14:00:00+00:00")[0]
  )
  assert "**after** this run" in lines("2026-12-04T13:00:00+00:00")[0]


class _Study:
  """The little of numbers.Study that run_info.header reads."""

  order, groups = ["rove"], {"rove": [0]}
  report = {
    "suite": "full",
    "runs": [
      {
        "step": 10,
        "workdir": "w",
        "model": {"n_layer": 1, "d_model": 8, "n_head": 1, "params": 10, "max_len": 16},
      }
    ],
  }


def test_tuned_run_names_still_pair_their_seeds():
  """The comparison's workdirs carry the chosen rate (rove-s3-lr0.004, and -steps900 for the
  long runs): the seed is still read from the name, so every comparison is seed-paired."""
  from study import numbers as rs
  from tests.study.test_reproduce import _hand_made

  assert [
    rs.run_seed({"name": n})
    for n in ("rove-s3-lr0.004", "rope-s12-steps900-lr0.016", "nope-s2", "rove-steps900")
  ] == [3, 12, 2, "rove-steps900"]
  report = _hand_made()[0]
  for run in report["runs"]:
    if run["model"]["pos_encoding"] != "nope":
      run["name"] += "-lr0.004"
  st = rs.Study(report, boot=rs.Boot(200))
  c = st.ppl_cmp("rove", "rope", "none", 16)
  assert c.seeds_paired and len(c.seed_diffs) == 3


def test_encodings_with_fewer_seeds_pair_on_the_seeds_both_have():
  """NoPE trains on 3 of the 8 seeds: RoVE - NoPE is paired over seeds 0-2, each pair's
  difference the runs' weighted means (sum of scores / sum of weights)."""
  import numpy as np

  from study import numbers as rs

  rng = np.random.default_rng(0)
  runs = lambda n: tuple(rng.normal(2, 0.1, 6) for _ in range(n))  # noqa: E731
  w8, w3 = tuple(np.full(6, 2.0) for _ in range(8)), tuple(np.full(6, 2.0) for _ in range(3))
  a = rs.Units(runs(8), w8, seeds=tuple(range(8)))
  b = rs.Units(runs(3), w3, seeds=(2, 0, 1))
  c = rs.Boot(200).compare(a, b)
  assert c.seeds_paired
  want = [a.scores[s].sum() / 12 - b.scores[(2, 0, 1).index(s)].sum() / 12 for s in (0, 1, 2)]
  np.testing.assert_allclose(c.seed_diffs, want, rtol=1e-12)
  assert not rs.Boot(200).compare(a, rs.Units(runs(1), w3[:1], seeds=(0,))).seeds_paired
