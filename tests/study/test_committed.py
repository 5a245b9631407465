"""The verdict rules on the committed records (results/eval, results/eval_ppl, results/recall):
the primary family, its size and its seed-level p-values, recomputed here from the raw
per-window and per-sample numbers, and no verdict where the models cannot do the task.
results/README.md itself is regenerated only by `reproduce.py` (it needs the runs' metrics)."""

import json
import os
import re

import numpy as np
import pytest
from scipy import stats as sps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results")
N_BOOT = 200  # the verdicts and p-values do not depend on the bootstrap; its intervals do


def _load(*parts):
  with open(os.path.join(RESULTS, *parts)) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def committed():
  """(report with the perplexity-only main runs, claims rows, Study) of the committed run."""
  import reproduce
  from study import claims, writeup
  from study import numbers as rs

  report, ppl = _load("eval", "report.json"), _load("eval_ppl", "report.json")
  main = [
    {"workdir": r["workdir"], "kind": "main"}
    for r in ppl["runs"]
    if re.fullmatch(r"[a-z]+-s\d+(-lr[0-9.e+-]+)?", r["name"])
  ]  # not the -steps runs
  report = reproduce.with_ppl_runs(report, ppl, main)
  recall = _load("recall", "recall.json")
  st = rs.Study(report, recall["records"], rs.Boot(N_BOOT), reproduce.recall_chance(RESULTS))
  return report, claims.rows(st, writeup._train_len(report)), st


def _seed_losses(report, enc, length):
  """{seed: the run's loss at `length`, no YaRN}: summed window NLL over window tokens."""
  out = {}
  for r in report["runs"]:
    if r["model"]["pos_encoding"] == enc:
      row = r["perplexity"]["none"][str(length)]
      seed = int(re.match(r"[a-z]+-s(\d+)", r["name"]).group(1))  # ENC-sN, ENC-sN-lrRATE
      out[seed] = sum(row["window_nll"]) / sum(row["window_tokens"])
  return out


def test_primary_family_p_values_are_the_seed_pairs_t_tests(committed):
  from study import multiplicity, primary

  report, rows, _ = committed
  fam = [r for r in rows if r["family"] == "primary"]
  assert [r["id"] for r in fam] == ["b", "c", "c"]  # ICL and RULER left the family
  # every primary row has >= 2 seed pairs and a measurable statistic: all enter Holm
  assert primary.family_size(fam) == len(fam) == sum(r["t"]["n"] >= 2 for r in fam)
  assert [r["p_holm"] for r in fam] == pytest.approx(multiplicity.holm([r["p"] for r in fam]))
  # (b) from the raw windows: the paired t-test over the seed pairs' loss differences
  T = report["runs"][0]["model"]["train_len"]
  rove, rope = _seed_losses(report, "rove", T), _seed_losses(report, "rope", T)
  assert sorted(rove) == sorted(rope) and len(rove) >= 2
  diffs = [rove[s] - rope[s] for s in sorted(rove)]
  [b] = [r for r in fam if r["id"] == "b"]
  assert b["t"]["n"] == len(diffs) >= 8  # the study's 8 seed pairs
  assert b["p"] == pytest.approx(sps.ttest_1samp(diffs, 0.0).pvalue, rel=1e-9)
  assert b["sign_flip"]["p"] >= b["sign_flip"]["p_min"] == 2 / 2 ** len(diffs)
  side = "supports" if np.mean(diffs) < 0 else "contradicts"
  assert b["verdict"] == (side if b["p"] < 0.05 else "inconclusive")


def test_no_verdict_where_every_answer_is_wrong(committed):
  from study import verdicts

  report, rows, _ = committed
  ruler = {}  # (encoding, setting): [correct, answers] over every task, length and seed
  for r in report["runs"]:
    for s, entry in ((r.get("ruler") or {}).get("settings") or {}).items():
      for cells in (entry.get("tasks") or {}).values():
        for cell in cells.values():
          k = ruler.setdefault((r["model"]["pos_encoding"], s), [0, 0])
          k[0] += sum(cell["sample_correct"])
          k[1] += len(cell["sample_correct"])
  assert ruler
  near = all(k / n <= verdicts.MARGIN for (e, _), (k, n) in ruler.items() if e != "nope")
  ruler_rows = [r for r in rows if r["id"] in ("e", "f") and r["test"].startswith("RULER")]
  assert ruler_rows
  for r in ruler_rows:  # RULER's answers are open-ended: chance 0
    assert r["verdict"].startswith(verdicts.NOT_MEASURABLE) == near, r["test"]
    assert r["verdict"] not in verdicts.DECIDED or not near
    assert "p_holm" not in r or not near
  for r in rows:  # nowhere does a not-measurable row enter Holm or keep a decided verdict
    if r["verdict"].startswith(verdicts.NOT_MEASURABLE):
      assert "p_holm" not in r and r["verdict_holm"] == r["verdict"]


def test_the_exploratory_family_states_its_size(committed):
  from study import claims_table, primary

  _, rows, st = committed
  text = "\n".join(claims_table.table(rows, primary.left_note(st)))
  for fam in ("primary", "exploratory"):
    got = [r for r in rows if r["family"] == fam]
    assert f"Tally, Holm over {primary.family_size(got)} rows:" in text
  assert "left the primary family" in text and "RoVE 0/" in primary.left_note(st)


def test_the_docs_state_the_computed_family_size(committed):
  from study import primary

  _, rows, _ = committed
  m = primary.family_size([r for r in rows if r["family"] == "primary"])
  with open(os.path.join(ROOT, "docs", "results.md")) as f:
    text = " ".join(f.read().split())
  assert f"Holm over its {m} rows" in text and f"after Holm over {m} rows" in text


def test_the_committed_sweep_chose_each_rate_inside_its_grid():
  """results/lr_sweep.json: every rotary encoding swept on >= 4 rates and >= 3 seeds, its
  chosen rate the lowest mean loss and strictly inside the grid (the rule recomputed here)."""
  sweep = _load("lr_sweep.json")
  assert sorted(sweep["chosen"]) == ["rope", "rove"] and not sweep["refused"]
  assert len(sweep["seeds"]) >= 3
  for enc, by_rate in sweep["losses"].items():
    rates = sorted(by_rate, key=float)
    assert len(rates) >= 4 and all(len(v) == len(sweep["seeds"]) for v in by_rate.values())
    best = min(rates, key=lambda lr: np.mean(by_rate[lr]))
    assert float(best) == sweep["chosen"][enc] and best not in (rates[0], rates[-1])
