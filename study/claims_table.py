"""results/README.md's claims table (the families of study/claims.py's rows with their verdicts
raw and after Holm, each family's size computed from its rows) and the closing note."""

from __future__ import annotations

from study import numbers as rs
from study import primary, verdicts


def table(rows_: list, left_note: str = "") -> list:
  """The claims table: the primary family, the exploratory rows (with `left_note`, why rows
  left the primary family), YaRN's rows; each family's Holm size computed from its rows."""
  L = ["## The paper's claims, one by one\n"]
  if not rows_:
    return L + ["Needs RoVE and RoPE runs.\n"]
  fams = {f: [r for r in rows_ if r.get("family") == f] for f in ("primary", "exploratory", "yarn")}
  m = {f: primary.family_size(fams[f]) for f in ("primary", "exploratory")}
  L += [
    'RoVE against RoPE. Figures: estimate [95 % bootstrap interval] (see "How the '
    'intervals are computed"). Verdicts (study/verdicts.py): *raw* from the paired '
    f"t-test over seed pairs (two-sided, p < {verdicts.ALPHA:g}, the side from the mean "
    f"seed-pair difference), with the exact sign-flip test over the same pairs beside it; "
    f"with fewer than {verdicts.MIN_PAIRS} seed pairs there is no seed-level test and the "
    f"verdict is *inconclusive*, saying so; an accuracy within "
    f"{verdicts.MARGIN:g} of the task's chance for both encodings gives *"
    f"{verdicts.NOT_MEASURABLE}*. *Holm* after Holm's adjustment of the t-tests' p-values "
    "over the tested rows of the row's family (study/multiplicity.py), which keeps the "
    "chance of any false verdict in the family at 5 %.\n",
    f"### Primary comparisons ({len(fams['primary'])} rows, {m['primary']} in Holm's "
    f"family; the abstract's claims, study/primary.py)\n",
    "The seed-level column takes each seed pair's difference of the run statistic (the "
    "loss in nats for perplexity, the answer NLL, the accuracy): its mean with the 95 % "
    "t-interval, the paired t-test's p and the exact sign-flip test's p (with n pairs it "
    "cannot go below 2 / 2^n).\n",
    "| # | the paper's claim (where) | test here | figure [95 % interval] | seed-level "
    "tests | raw | Holm |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in fams["primary"]:
    L.append(
      f"| {r['id']} | {r['claim']} | {r['test']} | {r['figure']} | "
      f"{primary.t_cell(r)} | {r['verdict']} | {r['verdict_holm']} |"
    )
  L.append(
    f"\nTally, Holm over {m['primary']} rows: "
    f"{_fmt_tally(tally(fams['primary'], 'verdict_holm'))}; raw: "
    f"{_fmt_tally(tally(fams['primary']))}.\n"
  )
  L += [
    f"### Exploratory rows ({len(fams['exploratory'])} rows, {m['exploratory']} in Holm's "
    f"family)\n",
    "Per length, per task and per setting, the retrieval study, and the rows that left the "
    "primary family; Holm over this family's tested rows together."
    + (f" {left_note}" if left_note else "")
    + "\n",
    "| # | the paper's claim (where) | test here | figure [95 % interval] | seed-level "
    "p | raw | Holm |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in fams["exploratory"]:
    claim = r["claim"] + (" (left the primary family)" if r.get("left_primary") else "")
    L.append(
      f"| {r['id']} | {claim} | {r['test']} | {r['figure']} | {primary.p_cell(r)} | "
      f"{r['verdict']} | {r['verdict_holm']} |"
    )
  L.append(
    f"\nTally, Holm over {m['exploratory']} rows: "
    f"{_fmt_tally(tally(fams['exploratory'], 'verdict_holm'))}; raw: "
    f"{_fmt_tally(tally(fams['exploratory']))}.\n"
  )
  if fams["yarn"]:
    L += [
      "### YaRN against no YaRN (d1: the paper's claim about YaRN, not about RoVE)\n",
      "Both encodings must improve for *supports* (each: the t-test over its runs of the "
      "within-run loss change); these rows count neither for nor against RoVE.\n",
      "| # | the paper's claim (where) | test here | figure [95 % interval] | verdict |",
      "|---|---|---|---|---|",
    ]
    L += [
      f"| {r['id']} | {r['claim']} | {r['test']} | {r['figure']} | {r['verdict']} |"
      for r in fams["yarn"]
    ]
    L.append(f"\nTally: {_fmt_tally(tally(fams['yarn']))}.\n")
  return L


def _fmt_tally(t: dict) -> str:
  return ", ".join(f"{k} {n}" for k, n in t.items()) or "none"


def tally(rows_: list, key: str = "verdict") -> dict:
  out = {}
  for r in rows_:
    k = r.get(key, r["verdict"]).split(":")[0]
    out[k] = out.get(k, 0) + 1
  return dict(sorted(out.items()))


def closing(st: rs.Study, base, rows_: list, meta: dict) -> list:
  """The closing note: wall time and the headline numbers with their intervals."""
  what = ""
  if st.recall:
    what = (
      ", retrieval study included"
      if meta.get("recall_rerun", True)
      else "; the retrieval study's records are an earlier run's, not rerun"
    )
  L = [
    "## Closing note\n",
    f"Wall time {meta['wall_seconds'] / 60:.1f} min (training and evaluation{what}).",
  ]
  if not rows_:
    return L + [""]
  heads = [
    f"({r['id']}) {r['test']}: {r['figure']}; {primary.p_cell(r)}; {r['verdict']}, "
    f"after Holm {r['verdict_holm']}"
    for r in rows_
    if r.get("family") == "primary"
  ]
  heads += [f"{r['test']}: {r['figure']}" for r in rows_ if r.get("recall")]
  L.append("Headline numbers: the primary comparisons (95 % intervals):\n")
  L += [f"- {h}" for h in heads]
  for fam, key in (("primary", "verdict_holm"), ("exploratory", "verdict_holm")):
    got = [r for r in rows_ if r.get("family") == fam]
    L.append(
      f"- {fam} rows after Holm over {primary.family_size(got)} rows: "
      f"{_fmt_tally(tally(got, key))} (raw: {_fmt_tally(tally(got))})"
    )
  L.append("")
  return L
