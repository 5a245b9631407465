"""results/README.md's "How the intervals are computed" section: the bootstrap (study/stats.py)
with this study's seed and unit counts, how a comparison and its verdict are read (the seed-level
test, study/verdicts.py), the multiplicity adjustment, and the intervals' coverage with this
many seed pairs; plus a sentence when RULER or ICL scored fewer runs than perplexity.
"""

from __future__ import annotations

from study import fmt, verdicts
from study import numbers as rs
from study.tables import ppl_lengths


def _unit_counts(st: rs.Study) -> str:
  parts = []
  ppl = {L: st.ppl_units(st.order[0], "none", L) for L in ppl_lengths(st.report)}
  ppl = {L: u.n_units for L, u in ppl.items() if u is not None}
  if ppl:
    parts.append(
      "perplexity windows (" + ", ".join(f"{n} at {L} tokens" for L, n in sorted(ppl.items())) + ")"
    )
  samples = {
    len(row["sample_nll"])
    for r in st.report["runs"]
    for s in ("none", "yarn")
    for rows in rs.ruler_tasks(r, s).values()
    for row in rows.values()
  }
  if samples:
    parts.append(f"RULER samples ({'/'.join(map(str, sorted(samples)))} a task and length)")
  tasks = st.icl_tasks()
  if tasks:
    icl = st.icl_units(st.order[0], tasks, 0)
    if icl is not None:
      parts.append(f"ICL prompts ({icl.n_units} a run over {len(tasks)} tasks)")
  if st.recall:
    n = sorted({len(r.get("sample_nll") or ()) for r in st.recall})
    parts.append(f"retrieval-study samples ({'/'.join(map(str, n))} a length)")
  return ", ".join(parts) or "none"


def section(st: rs.Study) -> list:
  seeds = ", ".join(f"{len(st.groups[e])} {fmt.name(e)}" for e in st.order)
  pairs = min((len(st.groups[e]) for e in ("rove", "rope") if e in st.groups), default=0)
  paired = "rove" in st.groups and "rope" in st.groups and st.seeds["rove"] == st.seeds["rope"]
  return [
    "## How the intervals are computed\n",
    f"Every cell is `estimate [lower, upper]`, a {rs.CI * 100:g} % percentile interval from a "
    f"hierarchical paired bootstrap (study/stats.py, {st.boot.n_boot} replicates; {seeds} "
    f"seeds). Each replicate resamples the training seeds and the evaluation units, "
    f"{_unit_counts(st)}. Seeds are paired across encodings: seed i gives every encoding "
    f"the same initialisation and batch order, so a replicate draws seed pairs, not each "
    f"encoding's seeds on its own"
    + ("" if paired else " (here RoVE's and RoPE's seeds differ, so they are resampled separately)")
    + ". Units are paired too: every run is scored on the same windows and samples in the "
    "same order, and a replicate draws one set of unit indices for all runs, within each "
    "task and length of a pooled statistic (its cells keep their shares). A comparison is "
    "RoVE minus the other encoding: for perplexity the relative difference "
    "exp(loss_RoVE - loss_other) - 1, for answer NLLs and accuracies the plain difference. "
    "The interval is the effect's; the verdict comes from the seeds (study/verdicts.py): the "
    "paired t-test over the seed pairs' differences of the run statistic, two-sided, "
    f"*supports* when p < {verdicts.ALPHA:g} and the mean difference lies on the claimed "
    f"side, *contradicts* when p < {verdicts.ALPHA:g} on the other side, *inconclusive* "
    f"otherwise; with fewer than {verdicts.MIN_PAIRS} seed pairs there is no seed-level test "
    "and the verdict says so. The exact sign-flip test over the same pairs is given beside "
    "the t-test in the claims table. A comparison where every compared encoding's accuracy "
    f"is within {verdicts.MARGIN:g} of the task's chance (a uniform guess among its answers, "
    f"computed per task; 0 for open-ended answers) is *{verdicts.NOT_MEASURABLE}*, above "
    f"{1 - rs.FLOOR:g} *at the ceiling*: counts, no verdict.\n",
    "Multiplicity: the claims table makes many verdicts. A short family of primary "
    "comparisons (the paper's perplexity claims: in-context, Sec. 4; out-of-distribution, "
    "the abstract and Sec. 4; one row a setting) was fixed before the "
    "numbers were read (study/primary.py); its verdicts are also given after Holm's "
    "adjustment of the t-tests' p-values, as are the exploratory rows', within their own "
    "family; the claims table states how many rows enter each. Each interval's "
    "Monte-Carlo error (the spread of its endpoints over 10 batches of the replicates) is "
    "computed, and an endpoint within 2 such errors of 0 is flagged in the table.\n",
    f"Coverage: with few seeds the seed level is resampled from few values and an interval "
    f"under-covers when the encoding-by-seed variation is large. Measured in simulation "
    f"(study/stats.py, 40 units with noise sd 1, i.e. sd 0.16 of a run's mean, a seed "
    f"effect shared by the pair), the nominal 95 % difference interval covered at "
    f"{rs.coverage_quote(3)} with 3 pairs and {rs.coverage_quote(8)} with 8. This study "
    f"has {pairs} RoVE-RoPE pair{'s' if pairs != 1 else ''}"
    + (
      "; the verdicts rest on the paired t-test over those pairs, not on the interval."
      if pairs > 1
      else ": too few for a seed-level test, so no verdict is decided."
    )
    + _subsets(st)
    + "\n",
  ]


def _subsets(st: rs.Study) -> str:
  """A sentence when RULER or ICL scored fewer runs than perplexity (added seeds evaluated
  on perplexity only)."""
  parts = []
  for what, runs in (("RULER", lambda e: st.ruler_runs(e, "none")), ("ICL", st.icl_runs)):
    counts = {e: len(runs(e)) for e in st.order}
    if any(n < len(st.groups[e]) for e, n in counts.items()):
      parts.append(
        f"{what} scored " + ", ".join(f"{n} {fmt.name(e)}" for e, n in counts.items()) + " of them"
      )
  return (
    (" Perplexity uses every run; " + "; ".join(parts) + ", and its rows pair those seeds.")
    if parts
    else ""
  )
