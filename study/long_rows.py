"""The second study's numbers (study/preregistration_long.md), from the committed records of
results/long: the primary family P1-P7 with Holm over its 7 rows, the exploratory rows (every
length, the YaRN versions of P4-P7, the rate sensitivity on the sweep's pairs) with Holm over
their own tested rows, and the held-out gap against training steps.

Records: <out>/reports/KIND-NAME.json (the run's rove-eval perplexity report) and
<out>/metrics/KIND-NAME.jsonl (its training metrics), KIND "sweep" or "primary", NAME
ENC-sSEED-lrRATE (study/long_study.py). A statistic that combines a run's cells (the mean over
2x-16x, that minus the cell at T, 16x minus T) is a linear combination of per-window losses
(study/units.py `pooled`), so the bootstrap resamples windows within each length.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
from typing import Optional, Sequence

from study import multiplicity, primary, verdicts
from study import numbers as rs
from study.units import Units, pooled, pooled_strata, ppl_units

ALPHA = 0.05
MARGIN = math.log(1.01)  # P1's equivalence margin: RoVE / RoPE perplexity within 1/1.01..1.01
T = 128
LONGER = (256, 512, 1024, 2048)
NAME = re.compile(r"(sweep|primary)-(\w+)-s(\d+)-lr([0-9.e+-]+)")
OUTCOMES = {
  "equivalent": "equivalent (within +-1 %)",
  "lower": "RoVE better (beyond -1 %)",
  "higher": "RoVE worse (beyond +1 %)",
  "inconclusive": "inconclusive",
}
PAPER = {
  "P1": 'RoVE improves in-context perplexity (Sec. 4 "RoVE improves in the trained regime", '
  "Table 1)",
  "P2": 'RoVE improves out-of-distribution perplexity (abstract; Sec. 4 "RoVE and YaRN are '
  'complementary": up to 16x without YaRN)',
  "P3": 'the gap holds with YaRN (Sec. 4 "RoVE and YaRN are complementary": YaRN improves '
  "both baselines while largely preserving the gap)",
  "P4": "RoVE's gain past T is more than its gain at T: extrapolation (Sec. 1 \"long-context "
  'robustness"; Sec. 2 "YaRN": RoPE\'s low frequencies meet unseen angles past T)',
  "P5": 'does RoVE itself degrade past T? (Sec. 1, Sec. 2 "YaRN")',
  "P6": 'does RoPE degrade past T? (Sec. 2 "YaRN")',
  "P7": "RoVE degrades less than RoPE: its 16x / T ratio against RoPE's (Sec. 1, Sec. 2)",
}


def load(out: str) -> list[dict]:
  """Every evaluated run of <out>: {kind, encoding, seed, lr, key, report (its run entry),
  curve (metrics rows)}, sorted by kind, rate, seed, encoding."""
  runs = []
  for path in glob.glob(os.path.join(out, "reports", "*.json")):
    key = os.path.basename(path)[: -len(".json")]
    m = NAME.fullmatch(key)
    if not m:
      continue
    with open(path) as f:
      report = json.load(f)
    curve = []
    mpath = os.path.join(out, "metrics", key + ".jsonl")
    if os.path.exists(mpath):
      with open(mpath) as f:
        curve = [json.loads(line) for line in f if line.strip()]
    runs.append(
      {
        "kind": m.group(1),
        "encoding": m.group(2),
        "seed": int(m.group(3)),
        "lr": float(m.group(4)),
        "key": key,
        "report": report["runs"][0],
        "curve": curve,
      }
    )
  return sorted(runs, key=lambda r: (r["kind"], r["lr"], r["seed"], r["encoding"]))


def finite(run: dict) -> bool:
  """Whether a run's final held-out loss and its loss at T are finite (preregistration: the
  pair of a diverged run leaves the family and the next seed replaces it)."""
  val = [
    row["val_loss"] for row in sorted(run["curve"], key=lambda r: r["step"]) if "val_loss" in row
  ]
  at_t = ((run["report"].get("perplexity") or {}).get("none") or {}).get(str(T)) or {}
  return bool(val) and math.isfinite(val[-1]) and math.isfinite(at_t.get("loss", math.nan))


def complete_pairs(runs: Sequence[dict], kind: str, rates: dict) -> list[int]:
  """The seeds with both encodings of `kind` evaluated at their rate in `rates`, both
  finite (`finite`)."""
  have = {
    (r["encoding"], r["seed"])
    for r in runs
    if r["kind"] == kind and rates.get(r["encoding"]) == r["lr"] and finite(r)
  }
  return sorted({s for _, s in have if all((e, s) in have for e in rates)})


def study(
  runs: Sequence[dict], kind: str, rates: dict, seeds: Sequence[int], boot: Optional[rs.Boot] = None
) -> rs.Study:
  """A numbers.Study of the pairs of `seeds` (each encoding at its rate in `rates`)."""
  pick = [
    dict(r["report"], seed=r["seed"])
    for r in runs
    if r["kind"] == kind and rates.get(r["encoding"]) == r["lr"] and r["seed"] in seeds
  ]
  return rs.Study({"runs": pick}, boot=boot)


def combo(st: rs.Study, enc: str, setting: str, coefs: dict) -> Optional[Units]:
  """Units whose per-run mean is sum_L coefs[L] * (the run's mean window loss at L), one
  stratum a length; at T every setting is the model as trained (the "none" cell)."""
  parts = []
  for length, c in coefs.items():
    u = ppl_units(st.groups[enc], "none" if length <= T else setting, length)
    if u is None:
      return None
    parts.append((c, [x / w for x, w in zip(u.scores, u.weights)]))
  return Units(pooled(parts), seeds=st.seeds[enc], strata=pooled_strata(parts))


BEYOND = {**{L: 1 / len(LONGER) for L in LONGER}, T: -1.0}  # 2x-16x minus T
RATIO16 = {2048: 1.0, T: -1.0}  # 16x minus T


def _run_values(units: Units) -> list[float]:
  return [float(s.mean()) for s in units.scores]


def _pct(x: float) -> str:
  return f"{100 * math.expm1(x):+.1f} %"


def _pval(p: Optional[float]) -> str:
  return "-" if p is None else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def _cmp_row(rid, claim, test, c) -> dict:
  """A RoVE - RoPE row from a Comparison: the paired t verdict on "RoVE lower"."""
  from study import fmt

  return primary.row(rid, claim, test, fmt.fmt_change(c), verdicts.verdict(c), c)


def _own_row(rid, claim, test, st, enc, setting) -> Optional[dict]:
  """P5 / P6: one encoding's 16x / T perplexity ratio, tested against 1 over its runs."""
  u = combo(st, enc, setting, RATIO16)
  if u is None:
    return None
  cell = st.boot.cell(u, math.expm1)
  vals = _run_values(u)
  t = multiplicity.paired_t(vals)
  verdict = (
    "inconclusive"
    if t is None or not t["p"] < ALPHA
    else ("degrades" if t["mean"] > 0 else "improves")
  )
  figure = (
    f"x{1 + cell.estimate:.2f} [{1 + cell.lower:.2f}, {1 + cell.upper:.2f}] "
    f"({100 * cell.estimate:+.0f} %)"
  )
  return primary.row(rid, claim, test, figure, verdict, diffs=vals)


def family(
  st: rs.Study,
  setting: str = "none",
  ids: Sequence[str] = ("P1", "P2", "P3", "P4", "P5", "P6", "P7"),
) -> list:
  """The rows P1-P7 (with setting "yarn": P4-P7's YaRN versions, exploratory)."""
  from study import fmt

  rows, tag = [], "" if setting == "none" else " (YaRN)"
  sname = fmt.SETTING_NAMES[setting]
  if "P1" in ids:
    c = st.ppl_cmp("rove", "rope", "none", T)
    diffs = verdicts.comparison_diffs(c)
    r = primary.row(
      "P1",
      PAPER["P1"],
      f"perplexity at {T} tokens, no YaRN: RoVE / RoPE - 1; TOST against +-1 %",
      fmt.fmt_change(c),
      "inconclusive",
      c,
    )
    tost = multiplicity.tost(diffs, MARGIN, ALPHA)
    if tost:
      r.update(tost=tost, p=tost["p"], verdict=OUTCOMES[tost["outcome"]])
      r["figure"] += (
        f"; 90 % t-interval {_pct(tost['lower'])} to {_pct(tost['upper'])}, "
        f"TOST p = {_pval(tost['p_equiv'])}, beyond -1 % p = "
        f"{_pval(tost['p_below'])}, beyond +1 % p = {_pval(tost['p_above'])}"
      )
    rows.append(r)
  for rid, s in (("P2", "none"), ("P3", "yarn")):
    if rid in ids:
      rows.append(
        _cmp_row(
          rid,
          PAPER[rid],
          f"perplexity at 256-2048 tokens (2x-16x), "
          f"{fmt.SETTING_NAMES[s]}: geometric mean of RoVE / RoPE - 1",
          st.ppl_mean_cmp("rove", "rope", s, LONGER),
        )
      )
  if "P4" in ids:
    c = st.boot.compare(
      combo(st, "rove", setting, BEYOND), combo(st, "rope", setting, BEYOND), "exp"
    )
    rows.append(
      _cmp_row(
        "P4" + tag,
        PAPER["P4"],
        f"the gap at 2x-16x ({sname}) beyond the "
        f"gap at T: (RoVE / RoPE at 2x-16x) / (RoVE / RoPE at T) - 1",
        c,
      )
    )
  for rid, enc in (("P5", "rove"), ("P6", "rope")):
    if rid in ids:
      r = _own_row(
        rid + tag,
        PAPER[rid],
        f"{fmt.name(enc)}'s perplexity at 2048 tokens (16x, "
        f"{sname}) / at {T} tokens, over its runs",
        st,
        enc,
        setting,
      )
      if r:
        rows.append(r)
  if "P7" in ids:
    c = st.boot.compare(
      combo(st, "rove", setting, RATIO16), combo(st, "rope", setting, RATIO16), "exp"
    )
    rows.append(
      _cmp_row(
        "P7" + tag, PAPER["P7"], f"RoVE's 16x / T perplexity ratio over RoPE's ({sname}) - 1", c
      )
    )
  return rows


def adjust(rows: list) -> list:
  """Holm over the rows with a p-value (their "p"): "p_holm", "holm_m", and "verdict_holm",
  the raw verdict when p_holm < ALPHA, else "inconclusive" (every decided outcome, the
  equivalence ones and P5-P6's included)."""
  tested = [r for r in rows if r.get("p") is not None]
  for r, q in zip(tested, multiplicity.holm([r["p"] for r in tested])):
    r["p_holm"], r["holm_m"] = q, len(tested)
  for r in rows:
    decided = r["verdict"] != "inconclusive" and r.get("p_holm") is not None
    r["verdict_holm"] = r["verdict"] if decided and r["p_holm"] < ALPHA else "inconclusive"
  return rows


def exploratory(st: rs.Study, lengths: Sequence[int]) -> list:
  """Every length's RoVE - RoPE row (no YaRN at every length but T, YaRN past T) and P4-P7
  with YaRN."""
  from study import fmt

  rows = []
  for s in ("none", "yarn"):
    for L in lengths:
      if L == T or (s == "yarn" and L < T):
        continue
      rows.append(
        _cmp_row(
          f"{fmt.mult(L, T)}",
          "RoVE improves perplexity at this length",
          f"perplexity at {L} tokens ({fmt.mult(L, T)}), {fmt.SETTING_NAMES[s]}: RoVE / RoPE - 1",
          st.ppl_cmp("rove", "rope", s, L),
        )
      )
  return rows + family(st, "yarn", ("P4", "P5", "P6", "P7"))


def sensitivity(runs: Sequence[dict], chosen: dict, grids: dict) -> list:
  """The rate-sensitivity rows on the sweep's pairs: at each rate shared by both grids that is
  the chosen one or next to it, the gap at T, at 2x-16x without YaRN and beyond T."""
  rows = []
  shared = sorted(set(grids.get("rove", ())) & set(grids.get("rope", ())))
  near = set()
  for enc, lr in chosen.items():
    g = sorted(grids[enc])
    i = g.index(lr)
    near |= set(g[max(0, i - 1) : i + 2])
  for lr in [x for x in shared if x in near]:
    rates = {"rove": lr, "rope": lr}
    seeds = complete_pairs(runs, "sweep", rates)
    if len(seeds) < 2:
      continue
    st = study(runs, "sweep", rates, seeds)
    tag = f"{lr:g}" + (" (chosen)" if lr in chosen.values() else "")
    for rid, test, c in (
      ("1x", f"perplexity at {T} tokens", st.ppl_cmp("rove", "rope", "none", T)),
      (
        "2x-16x",
        "perplexity at 2x-16x, no YaRN (P2's statistic)",
        st.ppl_mean_cmp("rove", "rope", "none", LONGER),
      ),
      (
        "beyond",
        "the gap at 2x-16x beyond the gap at T, no YaRN (P4's statistic)",
        st.boot.compare(
          combo(st, "rove", "none", BEYOND), combo(st, "rope", "none", BEYOND), "exp"
        ),
      ),
    ):
      r = _cmp_row(
        rid,
        f"rate sensitivity at {tag}",
        f"sweep pairs (seeds {', '.join(map(str, seeds))}) at {tag}: {test}: RoVE / RoPE - 1",
        c,
      )
      r["lr"] = lr
      rows.append(r)
  return rows


def yarn_share(st: rs.Study, lengths: Sequence[int] = LONGER) -> dict:
  """{length: the RoVE - RoPE gap with YaRN over the gap without} (mean log-perplexity gaps
  over the pairs; exploratory, no test): 1 where YaRN keeps the whole gap."""
  out = {}
  for L in lengths:
    y, n = (st.ppl_cmp("rove", "rope", s, L) for s in ("yarn", "none"))
    if y is not None and n is not None and n.estimate != 0:
      out[L] = math.log1p(y.estimate) / math.log1p(n.estimate)
  return out


def gap_by_step(runs: Sequence[dict], rates: dict, seeds: Sequence[int]) -> dict:
  """{step: [RoVE - RoPE held-out loss per pair, in seed order]} of the primary pairs (steps
  every pair has)."""
  val = {}
  for r in runs:
    if r["kind"] == "primary" and rates.get(r["encoding"]) == r["lr"] and r["seed"] in seeds:
      val[(r["encoding"], r["seed"])] = {
        row["step"]: row["val_loss"] for row in r["curve"] if "val_loss" in row
      }
  out = {}
  steps = set.intersection(*(set(v) for v in val.values())) if val else set()
  for step in sorted(steps):
    out[step] = [
      val[("rove", s)][step] - val[("rope", s)][step]
      for s in seeds
      if ("rove", s) in val and ("rope", s) in val
    ]
  return out
