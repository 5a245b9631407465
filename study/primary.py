"""The study's primary comparisons: a short list fixed before the numbers are read (the claims of
the paper's abstract, one statistic each), adjusted together with Holm's method.

The paper's abstract (arXiv 2606.11275) claims that RoVE, against RoPE, improves
few-shot in-context learning, out-of-distribution perplexity and long-context retrieval, most
on tasks requiring long-sequence aggregation; Section 4 adds in-context perplexity. One
statistic per claim and setting, RoVE against RoPE:

  a   ICL accuracy inside the training context, all synthetic tasks pooled (units resampled
      within each task); the paper measures DCLM-Core accuracy
  b   perplexity at the training length, no YaRN
  c   perplexity past the training length: the geometric mean over every evaluated length
      above T of the perplexity ratio, without YaRN and with YaRN at factor L / T (two rows)
  e   RULER answer NLL, mean over tasks and the evaluated lengths, without and with YaRN
  f   RULER: RoVE's NLL change on the aggregation tasks minus that on the others, without and
      with YaRN; it supports the claim only if the aggregation tasks themselves improve

Every other row of the claims table is exploratory (study/claims.py). The verdicts of this
family are given raw and after Holm's adjustment over its tested rows, with the paired t-test
over seed pairs beside the bootstrap (a second method: with few seeds the two can disagree,
and a verdict that only one of them gives is a weak one).
"""

from __future__ import annotations

from study import fmt
from study import multiplicity
from study import numbers as rs

SETTINGS = ("none", "yarn")  # YaRN with factor L / T; the fixed factor is exploratory

CLAIMS = {
    "a": "RoVE improves few-shot in-context learning (abstract; Sec. 4, Table 1: Core ICL "
         "accuracy inside the training context)",
    "b": "RoVE improves in-context perplexity (Sec. 4 \"RoVE improves in the trained regime\")",
    "c": "RoVE improves out-of-distribution perplexity (abstract; Sec. 4: up to 16x the "
         "training context, with and without YaRN)",
    "e": "RoVE improves long-context retrieval (abstract; Sec. 4: RULER scored by NLL)",
    "f": "the improvements are largest on tasks requiring long-sequence aggregation (abstract; "
         "Sec. 4)",
}


def row(cid, claim, test, figure, verdict, result=None, **extra) -> dict:
  """One row of the claims table (every family): with a comparison `result`, its numbers, its
  p-value for the Holm adjustment, and a flag on the figure when an endpoint lies within 2
  Monte-Carlo errors of 0."""
  out = {"id": cid, "claim": claim, "test": test, "figure": figure, "verdict": verdict, **extra}
  if result is not None:
    out.update(estimate=result.estimate, lower=result.lower, upper=result.upper,
               p=result.p_value, mc_stable=result.mc_stable)
    if not result.mc_stable:
      out["figure"] += " (an endpoint within 2 Monte-Carlo errors of 0)"
  return out


def _row(cid, test, figure, verdict, result=None) -> dict:
  """A primary row: `row` with the paired t-test over seed pairs."""
  t = multiplicity.paired_t(result.seed_diffs) if result and result.seeds_paired else None
  return row(cid, CLAIMS[cid], test, figure, verdict, result, family="primary", t=t)


def rows(st: rs.Study, base, ppl_lengths) -> list:
  """The primary rows, RoVE against RoPE, with Holm's verdicts ([] without both)."""
  if not {"rove", "rope"} <= set(st.groups):
    return []
  out = []
  tasks = st.icl_tasks()
  if tasks:
    counts = [st.icl_count(e, tasks) for e in ("rove", "rope")]
    shown = f"RoVE {fmt.fmt_count(counts[0])}, RoPE {fmt.fmt_count(counts[1])} correct"
    test = (f"synthetic ICL accuracy, {len(tasks)} tasks pooled, inside the {base}-token "
            f"training context: RoVE - RoPE")
    if rs.at_floor(counts):
      out.append(_row("a", test, shown, f"at the floor: {shown}"))
    else:
      c = st.icl_cmp("rove", "rope", tasks, 1)
      out.append(_row("a", test, f"{fmt.fmt_change(c, 3)} ({shown})",
                      rs.verdict(c, "higher"), c))
  c = st.ppl_cmp("rove", "rope", "none", base)
  if c is not None:
    out.append(_row("b", f"perplexity at the training length ({base} tokens), no YaRN: "
                         f"RoVE / RoPE - 1", fmt.fmt_change(c), rs.verdict(c), c))
  longer = [x for x in ppl_lengths if x > base]
  for s in SETTINGS:
    c = st.ppl_mean_cmp("rove", "rope", s, longer) if longer else None
    if c is not None:
      out.append(_row("c", f"perplexity at {', '.join(map(str, longer))} tokens "
                           f"({fmt.mult(longer[0], base)}-{fmt.mult(longer[-1], base)}), "
                           f"{fmt.SETTING_NAMES[s]}: geometric mean of RoVE / RoPE - 1",
                      fmt.fmt_change(c), rs.verdict(c), c))
  for s in SETTINGS:
    if not {"rove", "rope"} <= set(st.ruler_encodings(s)):
      continue
    lengths = st.ruler_lengths(s)
    lens = sorted({x for ls in lengths.values() for x in ls})
    c = st.ruler_cmp("rove", "rope", s, "mean")
    if c is not None:
      out.append(_row("e", f"RULER answer NLL, mean over {len(lengths)} tasks at "
                           f"{', '.join(map(str, lens))} tokens, {fmt.SETTING_NAMES[s]}: "
                           f"RoVE - RoPE (nats)", fmt.fmt_change(c), rs.verdict(c), c))
    d, agg = st.ruler_cmp("rove", "rope", s, "agg-other"), st.ruler_cmp("rove", "rope", s, "agg")
    if d is None:
      continue
    verdict = rs.verdict(d)
    if verdict == "supports" and rs.verdict(agg) != "supports":
      verdict = "inconclusive: the aggregation tasks themselves do not improve"
    out.append(_row(
        "f", f"RULER, {fmt.SETTING_NAMES[s]}: RoVE - RoPE NLL on the aggregation tasks "
             f"({', '.join(t for t in lengths if t in rs.AGGREGATION)}) minus the same on the "
             f"others; below 0 with the aggregation tasks improving supports",
        f"aggregation {fmt.fmt_change(agg)}; others "
        f"{fmt.fmt_change(st.ruler_cmp('rove', 'rope', s, 'other'))}; difference "
        f"{fmt.fmt_change(d)}", verdict, d))
  return adjust(out)


def adjust(rows_: list) -> list:
  """Adds each row's Holm-adjusted p-value ("p_holm") and verdict ("verdict_holm") over the
  tested rows (those with a p-value whose verdict comes from it: not at the floor or the
  ceiling); the others keep their verdict."""
  tested = [r for r in rows_ if r.get("p") is not None and not r["verdict"].startswith(
      ("at the floor", "at the ceiling", "not measured"))]
  for r, q in zip(tested, multiplicity.holm([r["p"] for r in tested])):
    r["p_holm"] = q
  for r in rows_:
    r["verdict_holm"] = multiplicity.adjusted_verdict(r["verdict"], r.get("p_holm"))
  return rows_


def t_cell(row: dict) -> str:
  """The paired t-test's cell: mean difference of the per-run statistic, its 95 % t-interval,
  p and the number of pairs; "-" without paired seeds."""
  t = row.get("t")
  if not t:
    return "-"
  return (f"{t['mean']:+.3f} [{t['lower']:+.3f}, {t['upper']:+.3f}], p = {t['p']:.3f} "
          f"({t['n']} pairs)")
