"""Paired, hierarchical bootstrap intervals for comparing positional encodings over seeds.

Every run (one training seed of one encoding) is scored on the same evaluation units in the
same order: perplexity windows (summed NLL and token count), RULER samples (answer NLL, exact
match), ICL samples (NLL, correct). A run's statistic is the mean of its per-unit scores, or
with `weights` the ratio estimator sum(scores) / sum(weights) (perplexity: summed window NLLs
over window token counts, the run's loss in nats per token).

One bootstrap replicate resamples, with replacement,
  - the seeds: with `pair_seeds` ONE index array for both encodings, so seed i of A is drawn
    with seed i of B (a seed gives every encoding the same initialisation and batch order:
    seed effects shared by the pair cancel in the difference); otherwise each encoding's
    seeds independently (the runs are the training-seed population), and
  - the units, with ONE index array shared by all runs of both encodings (the pairing: a hard
    window is hard for every run, so its difficulty cancels in the difference); with `strata`
    the units are drawn within each stratum (a task, a length), so a pooled statistic keeps
    every stratum's share in every replicate,
then averages the per-run statistics over the resampled seeds of each encoding and contrasts
the two means. The interval is the percentile interval of the replicates; the point estimate
is the contrast on the full data. With one seed of an encoding there is no seed spread to
resample: the result says so (`seed_spread_included=False`) and covers unit noise only.

Every result also carries the bootstrap's two-sided p-value for "the contrast is 0" (for
multiplicity control, study/multiplicity.py) and the Monte-Carlo standard error of its interval
endpoints (from 10 batches of the replicates): a verdict whose deciding endpoint lies within 2
of those errors of 0 could flip with the bootstrap's seed, and `Comparison.mc_stable` says so.

This module holds the result types and the two entry points (paired_difference, mean_interval);
their parts (the checks of the inputs, one chunk of resampling, what is read off the replicates)
are in study/bootstrap.py.

Limits a reader should know: with few seeds the seed level of the bootstrap is coarse (a
resample of 3 seeds takes at most 10 distinct values, and its variance is (n-1)/n of the
sample's), so when the seed-to-seed spread dominates the interval is too narrow: with 3 seed
pairs the method, not the data, can decide a verdict, hence the study's 8 pairs and the paired
t-test beside each primary comparison (study/multiplicity.py). When unit noise dominates,
resampling both levels counts it twice and the interval is conservative. tests/study/test_stats.py
measures coverage on simulated seeds and units (bench/RESULTS.md has the figures).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

from study.bootstrap import (
  apply_contrast,
  as_runs,
  as_strata,
  as_weights,
  check_options,
  mc_errors,
  percentiles,
  run_stats,
  seed_mean,
  seed_pick,
  two_sided_p,
  unit_counts,
)

CONTRASTS = ("difference", "relative", "exp")
CLAIMS = ("lower", "higher")
# Replicates are processed in chunks of about this many drawn unit indices (bounded memory);
# the chunk size depends only on n_units, so results depend only on the inputs and `seed`.
_CHUNK_ELEMENTS = 1 << 21


@dataclasses.dataclass(frozen=True)
class Interval:
  """One encoding's statistic (mean over seeds of the per-run statistic) with its interval.

  Attributes:
    estimate: the statistic on the full data.
    lower, upper: the percentile interval of the bootstrap replicates.
    ci: the interval's nominal coverage.
    n_seeds, n_units, n_boot: the runs, units per run and bootstrap replicates.
    seed_spread_included: False with a single run (the interval covers unit noise only).
    mc_se: the Monte-Carlo standard errors of (lower, upper); None below 200 replicates.
    n_strata: the strata the units were resampled within (1: none).
  """

  estimate: float
  lower: float
  upper: float
  ci: float
  n_seeds: int
  n_units: int
  n_boot: int
  seed_spread_included: bool
  mc_se: Optional[tuple] = None
  n_strata: int = 1

  def transformed(self, fn: Callable[[float], float]) -> "Interval":
    """The interval under an increasing function, e.g. math.exp for loss -> perplexity
    (percentile intervals commute with increasing maps)."""
    return dataclasses.replace(
      self,
      estimate=float(fn(self.estimate)),
      lower=float(fn(self.lower)),
      upper=float(fn(self.upper)),
    )


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Encoding A against encoding B: a contrast whose null value is 0.

  Attributes:
    estimate: the contrast on the full data: A - B ("difference"), A / B - 1 ("relative"),
      or exp(A - B) - 1 ("exp"; on losses, the relative perplexity difference).
    lower, upper: the percentile interval of the bootstrap replicates.
    a, b: each encoding's statistic on the full data (mean over its seeds).
    contrast: one of CONTRASTS.
    ci: the interval's nominal coverage.
    n_seeds_a, n_seeds_b, n_units, n_boot: runs per encoding, units, bootstrap replicates.
    paired: whether units were resampled jointly for A and B (the default).
    seed_spread_included: False when either encoding has a single run.
    seeds_paired: whether seed i of A was resampled together with seed i of B.
    p_value: the bootstrap's two-sided p-value for a contrast of 0 (None when not computed).
    mc_se: the Monte-Carlo standard errors of (lower, upper); None below 200 replicates.
    n_strata: the strata the units were resampled within (1: none).
    seed_diffs: with paired seeds, each pair's A - B of the per-run statistic on the full data
      (for the paired t-test, study/multiplicity.py); () otherwise.
  """

  estimate: float
  lower: float
  upper: float
  a: float
  b: float
  contrast: str
  ci: float
  n_seeds_a: int
  n_seeds_b: int
  n_units: int
  n_boot: int
  paired: bool
  seed_spread_included: bool
  seeds_paired: bool = False
  p_value: Optional[float] = None
  mc_se: Optional[tuple] = None
  n_strata: int = 1
  seed_diffs: tuple = ()

  @property
  def mc_stable(self) -> bool:
    """False when the endpoint nearest 0 lies within 2 Monte-Carlo errors of 0 (the verdict
    could change with the bootstrap's seed); True when the errors are unknown (None)."""
    if self.mc_se is None:
      return True
    lo, hi = self.mc_se
    if self.lower > 0:
      return not abs(self.lower) <= 2 * lo
    if self.upper < 0:
      return not abs(self.upper) <= 2 * hi
    return not (min(abs(self.lower), abs(self.upper)) <= 2 * max(lo, hi))

  @property
  def direction(self) -> str:
    """ "A lower" or "A higher" when the interval excludes 0, else "inconclusive"."""
    if self.upper < 0:
      return "A lower"
    if self.lower > 0:
      return "A higher"
    return "inconclusive"


def verdict(result: Comparison, claim: str = "lower") -> str:
  """What the comparison's interval says about the claim "A is `claim` than B" (the
  write-up's verdicts come from the seed-level tests instead: study/verdicts.py).

  Args:
    result: a `paired_difference` result.
    claim: "lower" (e.g. A's loss is lower) or "higher" (e.g. A's accuracy is higher).

  Returns:
    "supports" when the interval excludes 0 on the claimed side, "contradicts" when it
    excludes 0 on the other side, else "inconclusive".
  """
  if claim not in CLAIMS:
    raise ValueError(f"claim must be one of {CLAIMS}, got {claim!r}")
  direction = result.direction
  if direction == "inconclusive":
    return "inconclusive"
  return "supports" if direction == f"A {claim}" else "contradicts"


def paired_difference(
  a_runs: Sequence,
  b_runs: Sequence,
  *,
  weights=None,
  contrast: str = "difference",
  n_boot: int = 2000,
  seed: int = 0,
  ci: float = 0.95,
  paired: bool = True,
  pair_seeds: bool = False,
  strata=None,
) -> Comparison:
  """Encoding A against encoding B with a paired, hierarchical bootstrap interval.

  Args:
    a_runs: one 1-D array of per-unit scores per seed of encoding A. Every run of A and B has
      the same units in the same order.
    b_runs: the same for encoding B.
    weights: None (a run's statistic is the mean score), or per-unit weights making it the
      ratio estimator sum(scores) / sum(weights): one array [n_units] shared by every run (e.g.
      window token counts, with scores the windows' summed NLLs), or a pair (weights_a,
      weights_b) of arrays [n_runs, n_units] (or [n_units]) per encoding.
    contrast: "difference" A - B; "relative" A / B - 1; "exp" exp(A - B) - 1 (on losses in
      nats, the relative perplexity difference ppl_A / ppl_B - 1).
    n_boot: bootstrap replicates.
    seed: the bootstrap's random seed (same inputs and seed, same result).
    ci: the interval's nominal coverage, strictly between 0 and 1.
    paired: False resamples A's and B's units independently (an unpaired bootstrap, for
      comparison only: it ignores that the units are shared).
    pair_seeds: a_runs[i] and b_runs[i] share training seed i (the same initialisation and
      batch order): resample the pairs, not each encoding's seeds on their own. Needs as many
      runs of A as of B, in the same seed order.
    strata: None, or one label per unit (e.g. the task or length it belongs to): units are
      resampled within each stratum.

  Returns:
    A Comparison; its null value is 0 for every contrast. See `verdict`. Replicates whose
    contrast is undefined (B's statistic 0 under "relative", a resample of zero-weight units
    only) are left out of the interval.

  Raises:
    ValueError: on no runs or no units, runs of different lengths, non-finite scores, bad
      weights or strata, an unknown contrast, n_boot < 1, ci outside (0, 1), or pair_seeds
      with different numbers of runs.
  """
  check_options(n_boot, ci)
  if contrast not in CONTRASTS:
    raise ValueError(f"contrast must be one of {CONTRASTS}, got {contrast!r}")
  sa, sb = as_runs(a_runs, "a_runs"), as_runs(b_runs, "b_runs")
  if sa.shape[1] != sb.shape[1]:
    raise ValueError(
      f"a_runs have {sa.shape[1]} units, b_runs {sb.shape[1]}; A and B must be "
      f"scored on the same units in the same order"
    )
  if pair_seeds and len(sa) != len(sb):
    raise ValueError(
      f"pair_seeds needs as many runs of A as of B (seed i of each is a pair), "
      f"got {len(sa)} and {len(sb)}; pass pair_seeds=False for unpaired seeds"
    )
  n_units = sa.shape[1]
  groups = as_strata(strata, n_units)
  if isinstance(weights, tuple) and len(weights) == 2 and np.ndim(weights[0]) >= 1:
    wa = as_weights(weights[0], len(sa), n_units, "weights_a")
    wb = as_weights(weights[1], len(sb), n_units, "weights_b")
  else:
    wa = as_weights(weights, len(sa), n_units, "weights")
    wb = as_weights(weights, len(sb), n_units, "weights")
  run_a, run_b = run_stats(sa, wa), run_stats(sb, wb)
  a, b = run_a.mean(), run_b.mean()
  rng = np.random.default_rng(seed)
  boot = np.empty(n_boot)
  step = max(1, _CHUNK_ELEMENTS // n_units)
  for start in range(0, n_boot, step):
    rows = min(step, n_boot - start)
    counts_a = unit_counts(rng, rows, n_units, groups)
    counts_b = counts_a if paired else unit_counts(rng, rows, n_units, groups)
    pick_a = seed_pick(rng, rows, len(sa))
    pick_b = pick_a if pair_seeds else seed_pick(rng, rows, len(sb))
    mean_a = seed_mean(run_stats(sa, wa, counts_a), pick_a)
    mean_b = seed_mean(run_stats(sb, wb, counts_b), pick_b)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
      boot[start : start + rows] = apply_contrast(mean_a, mean_b, contrast)
  lower, upper = percentiles(boot, ci, "paired_difference")
  with np.errstate(divide="ignore", invalid="ignore"):
    estimate = float(apply_contrast(a, b, contrast))
  return Comparison(
    estimate=estimate,
    lower=lower,
    upper=upper,
    a=float(a),
    b=float(b),
    contrast=contrast,
    ci=float(ci),
    n_seeds_a=len(sa),
    n_seeds_b=len(sb),
    n_units=n_units,
    n_boot=int(n_boot),
    paired=bool(paired),
    seed_spread_included=len(sa) > 1 and len(sb) > 1,
    seeds_paired=bool(pair_seeds),
    p_value=two_sided_p(boot),
    mc_se=mc_errors(boot, ci),
    n_strata=1 if groups is None else len(groups),
    seed_diffs=tuple(float(x) for x in run_a - run_b) if pair_seeds else (),
  )


def mean_interval(
  runs: Sequence, *, weights=None, n_boot: int = 2000, seed: int = 0, ci: float = 0.95, strata=None
) -> Interval:
  """One encoding's statistic (mean over its seeds) with a hierarchical bootstrap interval.

  Args:
    runs: one 1-D array of per-unit scores per seed, all on the same units in the same order.
    weights: None, or per-unit weights [n_units] (shared) or [n_runs, n_units]: the per-run
      statistic is then sum(scores) / sum(weights) (perplexity: the loss in nats per token;
      `Interval.transformed(math.exp)` gives the perplexity cell).
    n_boot, seed, ci, strata: as in `paired_difference`.

  Returns:
    An Interval.

  Raises:
    ValueError: as `paired_difference`.
  """
  check_options(n_boot, ci)
  scores = as_runs(runs, "runs")
  n_runs, n_units = scores.shape
  w = as_weights(weights, n_runs, n_units, "weights")
  groups = as_strata(strata, n_units)
  rng = np.random.default_rng(seed)
  boot = np.empty(n_boot)
  step = max(1, _CHUNK_ELEMENTS // n_units)
  for start in range(0, n_boot, step):
    rows = min(step, n_boot - start)
    per_run = run_stats(scores, w, unit_counts(rng, rows, n_units, groups))
    boot[start : start + rows] = seed_mean(per_run, seed_pick(rng, rows, n_runs))
  lower, upper = percentiles(boot, ci, "mean_interval")
  return Interval(
    estimate=float(run_stats(scores, w).mean()),
    lower=lower,
    upper=upper,
    ci=float(ci),
    n_seeds=n_runs,
    n_units=n_units,
    n_boot=int(n_boot),
    seed_spread_included=n_runs > 1,
    mc_se=mc_errors(boot, ci),
    n_strata=1 if groups is None else len(groups),
  )
