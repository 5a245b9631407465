"""The study's primary comparisons: a short list of the paper's abstract's claims, one
statistic each, to be fixed before the runs that decide them, adjusted together with Holm's
method over the paired t-tests' p-values (study/verdicts.py).

The paper's abstract (arXiv 2606.11275) claims that RoVE, against RoPE, improves
few-shot in-context learning, out-of-distribution perplexity and long-context retrieval, most
on tasks requiring long-sequence aggregation; Section 4 adds in-context perplexity. The primary
family, RoVE against RoPE:

  b   perplexity at the training length, no YaRN
  c   perplexity past the training length: the geometric mean over every evaluated length
      above T of the perplexity ratio, without YaRN and with YaRN at factor L / T (two rows)

The claims about ICL (a) and RULER (e, f) left the family (`former`, exploratory rows) after
the committed run's numbers were read, by the measurability rule: at this scale the models do
not do those tasks (their accuracy is at chance: an answer NLL there
measures how smooth the output distribution is, not the capability). A comparison enters the
primary family only with a variant whose in-distribution accuracy lies in ENTRY_BAND for both
encodings; none is built. Their statistics, kept as exploratory rows:

  a   ICL accuracy inside the training context, all synthetic tasks pooled (units resampled
      within each task); the paper measures DCLM-Core accuracy
  e   RULER answer NLL, mean over tasks and the evaluated lengths, without and with YaRN
  f   RULER: RoVE's NLL change on the aggregation tasks minus that on the others, without and
      with YaRN; it supports the claim only if the aggregation tasks themselves improve

Every other row of the claims table is exploratory (study/claims.py). The verdicts of this
family are given raw and after Holm's adjustment over its tested rows; the seed-level tests
(paired t, exact sign flip) stand beside the bootstrap interval of each effect.
"""

from __future__ import annotations

from study import fmt, multiplicity, verdicts
from study import numbers as rs

SETTINGS = ("none", "yarn")  # YaRN with factor L / T; the fixed factor is exploratory
# The in-distribution accuracy both encodings need for an accuracy-bearing task (ICL, RULER) to
# enter the primary family: inside it a difference between them is measurable.
ENTRY_BAND = (0.6, 0.9)

CLAIMS = {
  "a": "RoVE improves few-shot in-context learning (abstract; Sec. 4, Table 1: Core ICL "
  "accuracy inside the training context)",
  "b": 'RoVE improves in-context perplexity (Sec. 4 "RoVE improves in the trained regime")',
  "c": "RoVE improves out-of-distribution perplexity (abstract; Sec. 4: up to 16x the "
  "training context, with and without YaRN)",
  "e": "RoVE improves long-context retrieval (abstract; Sec. 4: RULER scored by NLL)",
  "f": "the improvements are largest on tasks requiring long-sequence aggregation (abstract; "
  "Sec. 4)",
}


def row(cid, claim, test, figure, verdict, result=None, diffs=None, **extra) -> dict:
  """One row of the claims table (every family): with a comparison `result`, its numbers and
  a flag on the figure when an endpoint lies within 2 Monte-Carlo errors of 0; with seed-pair
  differences (`diffs`, by default the result's) the seed-level tests ("t", "sign_flip") and
  "p", the paired t-test's p-value that decides the verdict and enters Holm's adjustment."""
  out = {"id": cid, "claim": claim, "test": test, "figure": figure, "verdict": verdict, **extra}
  if result is not None:
    out.update(
      estimate=result.estimate,
      lower=result.lower,
      upper=result.upper,
      p_boot=result.p_value,
      mc_stable=result.mc_stable,
    )
    if not result.mc_stable:
      out["figure"] += " (an endpoint within 2 Monte-Carlo errors of 0)"
    if diffs is None:
      diffs = verdicts.comparison_diffs(result)
  if diffs is not None:
    out.update(verdicts.seed_tests(diffs))
    out["p"] = out["t"]["p"] if out["t"] else None
  return out


def _row(cid, test, figure, verdict, result=None) -> dict:
  return row(cid, CLAIMS[cid], test, figure, verdict, result, family="primary")


def rows(st: rs.Study, base, ppl_lengths) -> list:
  """The primary rows, RoVE against RoPE, with Holm's verdicts ([] without both)."""
  if not {"rove", "rope"} <= set(st.groups):
    return []
  out = []
  c = st.ppl_cmp("rove", "rope", "none", base)
  if c is not None:
    out.append(
      _row(
        "b",
        f"perplexity at the training length ({base} tokens), no YaRN: RoVE / RoPE - 1",
        fmt.fmt_change(c),
        rs.verdict(c),
        c,
      )
    )
  longer = [x for x in ppl_lengths if x > base]
  for s in SETTINGS:
    c = st.ppl_mean_cmp("rove", "rope", s, longer) if longer else None
    if c is not None:
      out.append(
        _row(
          "c",
          f"perplexity at {', '.join(map(str, longer))} tokens "
          f"({fmt.mult(longer[0], base)}-{fmt.mult(longer[-1], base)}), "
          f"{fmt.SETTING_NAMES[s]}: geometric mean of RoVE / RoPE - 1",
          fmt.fmt_change(c),
          rs.verdict(c),
          c,
        )
      )
  return adjust(out)


NAMES = ("RoVE", "RoPE")


def measured(counts, chance, verdict: str) -> str:
  """`verdict`, or NOT_MEASURABLE (with the counts) when both encodings' accuracy is within
  the margin of chance (study/verdicts.py)."""
  return verdicts.measurable_note(counts, chance, NAMES) or verdict


def former(st: rs.Study, base) -> list:
  """The ICL (a) and RULER (e, f) rows that left the primary family: exploratory, each with its
  accuracy's measurability (study/verdicts.py) deciding whether it gets a verdict."""
  if not {"rove", "rope"} <= set(st.groups):
    return []
  out = []
  tasks = st.icl_tasks()
  if tasks:
    counts = [st.icl_count(e, tasks) for e in ("rove", "rope")]
    shown = f"RoVE {fmt.fmt_count(counts[0])}, RoPE {fmt.fmt_count(counts[1])} correct"
    test = (
      f"synthetic ICL accuracy, {len(tasks)} tasks pooled, inside the {base}-token "
      f"training context: RoVE - RoPE"
    )
    c = st.icl_cmp("rove", "rope", tasks, 1)
    out.append(
      row(
        "a",
        CLAIMS["a"],
        test,
        f"{fmt.fmt_change(c, 3)} ({shown})",
        measured(counts, verdicts.study_icl_chance(st, tasks), rs.verdict(c, "higher")),
        c,
      )
    )
  for s in SETTINGS:
    if not {"rove", "rope"} <= set(st.ruler_encodings(s)):
      continue
    lengths = st.ruler_lengths(s)
    lens = sorted({x for ls in lengths.values() for x in ls})
    counts = [st.ruler_count(e, s, "mean") for e in ("rove", "rope")]
    em = f"exact match RoVE {fmt.fmt_count(counts[0])}, RoPE {fmt.fmt_count(counts[1])}"
    c = st.ruler_cmp("rove", "rope", s, "mean")
    if c is not None:  # RULER's answers are open-ended: chance 0
      out.append(
        row(
          "e",
          CLAIMS["e"],
          f"RULER answer NLL, mean over {len(lengths)} tasks at "
          f"{', '.join(map(str, lens))} tokens, "
          f"{fmt.SETTING_NAMES[s]}: RoVE - RoPE (nats)",
          f"{fmt.fmt_change(c)}; {em}",
          measured(counts, 0.0, rs.verdict(c)),
          c,
        )
      )
    d, agg = st.ruler_cmp("rove", "rope", s, "agg-other"), st.ruler_cmp("rove", "rope", s, "agg")
    if d is None:
      continue
    verdict = rs.verdict(d)
    if verdict == "supports" and rs.verdict(agg) != "supports":
      verdict = "inconclusive: the aggregation tasks themselves do not improve"
    out.append(
      row(
        "f",
        CLAIMS["f"],
        f"RULER, {fmt.SETTING_NAMES[s]}: RoVE - RoPE NLL on the aggregation "
        f"tasks ({', '.join(t for t in lengths if t in rs.AGGREGATION)}) minus the same on the "
        f"others; below 0 with the aggregation tasks improving supports",
        f"aggregation {fmt.fmt_change(agg)}; others "
        f"{fmt.fmt_change(st.ruler_cmp('rove', 'rope', s, 'other'))}; difference "
        f"{fmt.fmt_change(d)}; {em}",
        measured(counts, 0.0, verdict),
        d,
      )
    )
  for r in out:
    r["left_primary"] = True
  return out


def left_note(st: rs.Study) -> str:
  """Why ICL and RULER left the primary family, from their accuracies ("" without them)."""
  if not {"rove", "rope"} <= set(st.groups):
    return ""
  parts = []
  tasks = st.icl_tasks()
  if tasks:
    counts = [st.icl_count(e, tasks) for e in ("rove", "rope")]
    chance = verdicts.study_icl_chance(st, tasks)
    parts.append(
      f"ICL (a, {len(tasks)} synthetic tasks, chance {chance:.3g}): "
      + ", ".join(f"{n} {fmt.fmt_count(k)}" for n, k in zip(NAMES, counts))
    )
  for s in SETTINGS:
    if {"rove", "rope"} <= set(st.ruler_encodings(s)):
      counts = [st.ruler_count(e, s, "mean") for e in ("rove", "rope")]
      parts.append(
        f"RULER (e, f), {fmt.SETTING_NAMES[s]} (chance 0): "
        + ", ".join(f"{n} {fmt.fmt_count(k)}" for n, k in zip(NAMES, counts))
      )
  if not parts:
    return ""
  lo, hi = ENTRY_BAND
  return (
    "ICL (claim a) and RULER (claims e, f) left the primary family (study/primary.py): "
    f"an accuracy-bearing task enters it only with an in-distribution accuracy of "
    f"{lo:.0%}-{hi:.0%} for both encodings, and no such variant is built. Answers right "
    f"here: " + "; ".join(parts) + '. Their rows are exploratory, marked "left the '
    'primary family".'
  )


UNTESTED = (verdicts.NOT_MEASURABLE, "at the ceiling", "not measured")


def adjust(rows_: list) -> list:
  """Adds each tested row's Holm-adjusted p-value ("p_holm") and the family's size ("holm_m")
  and every row's verdict after adjustment ("verdict_holm"). Tested: a row with a seed-level
  p-value whose verdict comes from it (not measurable, at the ceiling and not measured rows
  are not); the others keep their verdict."""
  tested = [r for r in rows_ if r.get("p") is not None and not r["verdict"].startswith(UNTESTED)]
  for r, q in zip(tested, multiplicity.holm([r["p"] for r in tested])):
    r["p_holm"], r["holm_m"] = q, len(tested)
  for r in rows_:
    r["verdict_holm"] = multiplicity.adjusted_verdict(r["verdict"], r.get("p_holm"))
  return rows_


def family_size(rows_: list) -> int:
  """How many rows entered Holm's adjustment (those `adjust` gave a p_holm)."""
  return sum(r.get("p_holm") is not None for r in rows_)


def t_cell(row: dict) -> str:
  """The seed-level tests' cell: the mean seed-pair difference of the per-run statistic with
  its 95 % t-interval, the paired t-test's p, the exact sign-flip test's p and the number of
  pairs; "-" without 2 seed pairs."""
  t, flip = row.get("t"), row.get("sign_flip")
  if not t:
    return "-"
  cell = f"{t['mean']:+.3f} [{t['lower']:+.3f}, {t['upper']:+.3f}], t p = {_p(t['p'])}"
  if flip:
    cell += f", sign-flip p = {_p(flip['p'])}"
  return cell + f" ({t['n']} pairs)"


def p_cell(row: dict) -> str:
  """The exploratory rows' cell: t p and sign-flip p over the seed pairs, "-" without."""
  t, flip = row.get("t"), row.get("sign_flip")
  if not t:
    return "-"
  return (
    f"t p = {_p(t['p'])}"
    + (f", sign-flip p = {_p(flip['p'])}" if flip else "")
    + f" ({t['n']} pairs)"
  )


def _p(p: float) -> str:
  return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
