"""The write-up's added sections: the training-length and learning-rate checks (study.checks)
and the position-dependent retrieval tasks by distance (study.position_tasks), on hand-made
inputs whose numbers are computed here independently."""

import math

import numpy as np
import pytest

from study import checks, position_tasks, stats
from study import numbers as rs


def _run(enc, seed, kind="main", **kw):
  name = f"{enc}-s{seed}" + {"main": "", "long": "-steps900", "lr": f"-lr{kw.get('lr')}"}[kind]
  return {"encoding": enc, "seed": seed, "kind": kind, "workdir": f"/runs/{name}", **kw}


def _report_run(run, inside, longer, yarn_longer):
  cells = lambda xs: {str(L): {"loss": x} for L, x in xs}  # noqa: E731
  return {
    "workdir": run["workdir"],
    "perplexity": {
      "none": cells([(128, inside), (256, longer[0]), (512, longer[1])]),
      "yarn": cells([(128, inside), (256, yarn_longer[0]), (512, yarn_longer[1])]),
    },
  }


def test_checks_section_reports_the_gaps_per_pair_and_learning_rate():
  runs = [_run(e, s) for e in ("rove", "rope") for s in (0, 1)]
  runs += [_run(e, s, "long", steps=900) for s in (0, 1) for e in ("rove", "rope")]
  runs += [_run(e, 0, "lr", lr=lr) for lr in (1e-3, 4e-3) for e in ("rove", "rope")]
  final = {}
  for i, r in enumerate(runs):  # distinct, known final held-out losses
    final[r["workdir"]] = 2.0 - 0.01 * i
  curves = {
    w: [{"step": 100, "val_loss": 3.0}, {"step": 300, "val_loss": v}, {"step": 300, "loss": 9.0}]
    for w, v in final.items()
  }
  main_rep = {
    "runs": [
      _report_run(r, 1.8 - 0.1 * (r["encoding"] == "rove"), (1.9, 2.0), (1.85, 1.9))
      for r in runs
      if r["kind"] == "main"
    ]
  }
  ppl_rep = {
    "runs": [
      _report_run(
        r,
        1.5 - 0.05 * (r["encoding"] == "rove"),
        (1.6, 1.8),
        (1.55, 1.6 + 0.1 * (r["encoding"] == "rove")),
      )
      for r in runs
      if r["kind"] == "long"
    ]
  }
  meta = {"train": {"steps": 300, "lr": 2e-3}}
  lines, summary = checks.section(runs, curves, [main_rep, ppl_rep], meta, 128)
  text = "\n".join(lines)
  assert "## Training length and learning rate" in text
  rows = [line for line in lines if line.startswith("| 0 |") or line.startswith("| 1 |")]
  # long check: seed 0 at 300 steps (main), then at 900
  main0 = next(r for r in rows if r.startswith("| 0 | 300 |"))
  gap = final["/runs/rove-s0"] - final["/runs/rope-s0"]
  assert f"{gap:+.3f}" in main0
  assert f"{100 * math.expm1(-0.1):+.1f} %" in main0  # perplexity at T, RoVE - RoPE
  long0 = next(r for r in rows if r.startswith("| 0 | 900 |"))
  assert f"{100 * math.expm1(-0.05):+.1f} %" in long0
  # beyond T with YaRN: the mean loss over 256 and 512, RoVE 0.05 higher
  assert long0.endswith(f"| {100 * math.expm1(0.05):+.1f} % |")
  assert len(summary["long"]) == 4
  # the learning-rate rows: the main rate and the two others, lowest loss named
  lr_rows = [r for r in rows if "e-" in r or "0.00" in r]
  assert any("0.002 (main)" in r for r in lr_rows) and len(summary["lr"]) == 3
  best_rove = min(
    (final[r["workdir"]], r.get("lr", 2e-3))
    for r in runs
    if r["encoding"] == "rove" and r["seed"] == 0 and r["kind"] != "long"
  )[1]
  assert f"RoVE {best_rove:g}" in text
  assert checks.section(runs[:4], curves, [main_rep], meta, 128) == ([], {})


def _position_data():
  T, n = 8, 6
  lengths = (8, 32, 128)
  rng = np.random.default_rng(0)
  dist = {L: np.sort(rng.integers(0, L, n))[::-1] for L in lengths}
  records = []
  for enc, p in (("rove", 0.8), ("rope", 0.5)):
    for seed in range(3):
      for setting in ("none", "yarn"):
        for L in lengths:
          correct = (rng.random(n) < p).astype(int).tolist()
          records.append(
            {
              "encoding": enc,
              "seed": seed,
              "setting": setting,
              "length": L,
              "multiple": L / T,
              "sample_correct": correct,
              "sample_nll": [0.5 + 0.1 * (1 - c) for c in correct],
              "accuracy": float(np.mean(correct)),
              "nll": 0.5 + 0.1 * (1 - float(np.mean(correct))),
            }
          )
  return {
    "train_len": T,
    "sample_distance": {str(L): d.tolist() for L, d in dist.items()},
    "records": records,
    "spec": "pairs=1,values=16,task=offset",
  }


def test_distance_units_select_the_bucket_samples_of_every_length_by_seed():
  data = _position_data()
  T = data["train_len"]
  units = position_tasks.distance_units(data, "rove", "none", 2, 4)
  expect, strata = {s: [] for s in range(3)}, []
  for L in (8, 32, 128):
    d = np.asarray(data["sample_distance"][str(L)])
    pick = (d >= 2 * T) & (d < 4 * T)
    if not pick.any():
      continue
    i = len(set(strata))  # one stratum a length that has samples in the bucket
    for r in data["records"]:
      if r["encoding"] == "rove" and r["setting"] == "none" and r["length"] == L:
        expect[r["seed"]] += list(np.asarray(r["sample_correct"])[pick])
    strata += [i] * int(pick.sum())
  assert units.seeds == (0, 1, 2)
  for s in range(3):
    np.testing.assert_array_equal(units.scores[s], expect[s])
  assert [i for i in units.strata] == strata
  last = position_tasks.distance_units(data, "rove", "none", 8, 16)
  assert last is not None and all(u.size for u in last.scores)
  assert (
    sum(int(np.sum(np.asarray(d) >= 8 * T)) for d in data["sample_distance"].values())
    == last.scores[0].size
  )


def test_by_distance_rows_are_seed_paired_bootstrap_comparisons():
  data = _position_data()
  boot = rs.Boot(n_boot=400)
  lines, summary = position_tasks.by_distance(data, boot)
  b = summary["buckets"].index([2, 4])
  a_u = position_tasks.distance_units(data, "rove", "none", 2, 4)
  b_u = position_tasks.distance_units(data, "rope", "none", 2, 4)
  c = stats.paired_difference(
    list(a_u.scores),
    list(b_u.scores),
    n_boot=400,
    seed=boot.seed,
    pair_seeds=True,
    strata=a_u.strata,
  )
  assert summary["accuracy"]["rove-rope"]["none"][b] == [c.estimate, c.lower, c.upper]
  assert c.seeds_paired
  assert any(line.startswith("| RoVE - RoPE | no YaRN |") for line in lines)
  md, png, summ = position_tasks.section({"offset": data}, boot, "p.png")
  assert md[0].startswith("## Position-dependent retrieval: the token k after a marker")
  assert "offset" in summ and summ["offset"]["by_distance"] == summary


def test_pair_table_prints_each_seed_pairs_accuracy_difference():
  from rove_jax.evaluation import recall as retrieval_scoring

  recs = [
    {
      "encoding": e,
      "seed": s,
      "setting": "none",
      "length": L,
      "accuracy": {"rove": 0.9, "rope": 0.6}[e] - 0.1 * s + 0.01 * L,
    }
    for e in ("rove", "rope")
    for s in (0, 1)
    for L in (32, 128)
  ]
  recs.append({"encoding": "rove", "seed": 2, "setting": "none", "length": 32, "accuracy": 1.0})
  lines = retrieval_scoring.pair_table(recs).splitlines()
  assert lines[0].startswith("rove - rope, accuracy (points) per seed pair")
  rows = [line.split() for line in lines[3:]]
  assert rows == [["none", "0", "+30", "+30"], ["none", "1", "+30", "+30"]]  # seed 2 unpaired
  assert retrieval_scoring.pair_table([r for r in recs if r["encoding"] == "rove"]) == ""


def test_position_task_rows_join_the_exploratory_family_with_seed_level_p_values():
  """Each position task's accuracy and NLL past T (per setting) are claim rows whose p is the
  paired t over the seed-pair differences of the runs' mean past T, and Holm adjusts them with
  the other exploratory rows."""
  from study import claims, multiplicity, primary

  data = _position_data()
  boot = rs.Boot(n_boot=400)
  rows = position_tasks.claim_rows({"offset": data}, boot)
  acc = [r for r in rows if "accuracy" in r["test"]]
  assert [r["recall"] for r in acc] == ["none", "yarn"]
  assert all(r["test"].startswith("position task offset (not in the paper)") for r in rows)
  for r in acc:  # the seed-level test, from the records by hand

    def run_mean(enc, seed):  # every sample past T of one run (the lengths hold equal counts)
      return np.mean(
        [
          c
          for rec in data["records"]
          if (rec["encoding"], rec["seed"], rec["setting"]) == (enc, seed, r["recall"])
          and rec["length"] > data["train_len"]
          for c in rec["sample_correct"]
        ]
      )

    diffs = np.array([run_mean("rove", s) - run_mean("rope", s) for s in range(3)])
    t = multiplicity.paired_t(list(diffs))
    assert r["p"] == pytest.approx(t["p"]) and r["t"]["mean"] == pytest.approx(diffs.mean())
  explore = primary.adjust([dict(r) for r in rows])
  assert {r["holm_m"] for r in explore if "p_holm" in r} == {len(rows)}
  assert claims.rows(rs.Study({"runs": []}, None, boot), 8, rows) == []  # needs RoVE and RoPE


def test_gap_lines_give_the_mean_gap_and_its_change_over_the_pairs():
  from scipy import stats as sp

  main = {0: -0.040, 1: -0.033, 2: -0.050}  # RoVE - RoPE held-out gap at 300 steps
  long = {0: -0.015, 1: -0.012, 2: -0.020}  # at 900
  longs = [
    {"seed": s, "steps": k, "val": (2.0 + g[s], 2.0)}
    for s in (0, 1, 2)
    for k, g in (("main", main), (900, long))
  ]
  [line] = checks.gap_lines(longs, 300)

  def cell(d):  # mean, t-interval and two-sided p, by scipy
    d = np.asarray(d)
    half = sp.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    p = sp.ttest_1samp(d, 0.0).pvalue
    return f"{d.mean():+.3f} [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}] (t p = {p:.3g})"

  change = [long[s] - main[s] for s in (0, 1, 2)]
  assert f"is {cell(list(main.values()))} nats at 300 steps" in line
  assert f"and {cell(list(long.values()))} at 900" in line
  assert f"from 300 to 900 steps is {cell(change)}" in line
  assert checks.gap_lines(longs[:2], 300) == []  # one pair: no test
