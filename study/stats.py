"""Paired, hierarchical bootstrap intervals for comparing positional encodings over seeds.

Every run (one training seed of one encoding) is scored on the same evaluation units in the
same order: perplexity windows (summed NLL and token count), RULER samples (answer NLL, exact
match), ICL samples (NLL, correct). A run's statistic is the mean of its per-unit scores, or
with `weights` the ratio estimator sum(scores) / sum(weights) (perplexity: summed window NLLs
over window token counts, the run's loss in nats per token).

One bootstrap replicate resamples, with replacement,
  - the seeds of each encoding (the runs are the training-seed population), and
  - the units, with ONE index array shared by all runs of both encodings (the pairing: a hard
    window is hard for every run, so its difficulty cancels in the difference),
then averages the per-run statistics over the resampled seeds of each encoding and contrasts
the two means. The interval is the percentile interval of the replicates; the point estimate
is the contrast on the full data. With one seed of an encoding there is no seed spread to
resample: the result says so (`seed_spread_included=False`) and covers unit noise only.

Limits a reader should know: with few seeds the seed level of the bootstrap is coarse (a
resample of 3 seeds takes at most 10 distinct values, and its variance is (n-1)/n of the
sample's), so when the seed-to-seed spread dominates the interval is too narrow; when unit noise
dominates, resampling both levels counts it twice and the interval is conservative. Measured
coverage of the 95 % difference interval, 3 seeds per encoding, 40 units, unit noise sd 1 (sd
0.16 of a run's mean), seed-offset sd 0 / 0.1 / 0.22 / 0.5 / 1.0: 99.5 / 98 / 95 / 88.5 / 84 %
(tests/test_stats.py checks the 0.22 case); with 5 seeds, still 88.5 % at seed sd 0.5.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

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
  """
  estimate: float
  lower: float
  upper: float
  ci: float
  n_seeds: int
  n_units: int
  n_boot: int
  seed_spread_included: bool

  def transformed(self, fn: Callable[[float], float]) -> "Interval":
    """The interval under an increasing function, e.g. math.exp for loss -> perplexity
    (percentile intervals commute with increasing maps)."""
    return dataclasses.replace(self, estimate=float(fn(self.estimate)),
                               lower=float(fn(self.lower)), upper=float(fn(self.upper)))


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

  @property
  def direction(self) -> str:
    """"A lower" or "A higher" when the interval excludes 0, else "inconclusive"."""
    if self.upper < 0:
      return "A lower"
    if self.lower > 0:
      return "A higher"
    return "inconclusive"


def verdict(result: Comparison, claim: str = "lower") -> str:
  """What the comparison says about the claim "A is `claim` than B".

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


# ------------------------------------------------------------------------------ validation


def _check_options(n_boot: int, ci: float) -> None:
  if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
    raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
  if not isinstance(ci, (int, float)) or not 0 < ci < 1:
    raise ValueError(f"ci must lie strictly between 0 and 1, got {ci!r}")


def _as_runs(runs, name: str) -> np.ndarray:
  """The runs' per-unit scores as a finite float64 array [n_runs, n_units]."""
  if isinstance(runs, np.ndarray) and runs.ndim == 1:
    raise ValueError(f"{name}: expected a list of runs (1-D arrays), got one 1-D array; "
                     f"wrap a single run as [scores]")
  runs = [np.asarray(r, dtype=np.float64) for r in runs]
  if not runs:
    raise ValueError(f"{name}: no runs")
  for i, r in enumerate(runs):
    if r.ndim != 1:
      raise ValueError(f"{name}[{i}]: per-unit scores must be 1-D, got shape {r.shape}")
    if r.size == 0:
      raise ValueError(f"{name}[{i}]: no units")
    if r.size != runs[0].size:
      raise ValueError(f"{name}: run {i} has {r.size} units, run 0 has {runs[0].size}; every "
                       f"run must be scored on the same units in the same order")
  runs = np.stack(runs)
  bad = np.flatnonzero(~np.isfinite(runs).all(axis=1))
  if bad.size:
    raise ValueError(f"{name}[{bad[0]}]: scores must be finite")
  return runs


def _as_weights(weights, n_runs: int, n_units: int, name: str) -> Optional[np.ndarray]:
  """None, or positive weights broadcast to [n_runs, n_units]."""
  if weights is None:
    return None
  try:
    w = np.asarray(weights, dtype=np.float64)
  except ValueError:  # rows of different lengths
    raise ValueError(f"{name} must have shape ({n_units},) (shared by every run) or "
                     f"({n_runs}, {n_units}) (one row per run); got rows of different "
                     f"lengths") from None
  if w.shape not in ((n_units,), (n_runs, n_units)):
    raise ValueError(f"{name} must have shape ({n_units},) (shared by every run) or "
                     f"({n_runs}, {n_units}) (one row per run), got {w.shape}")
  if not np.all(np.isfinite(w)) or np.any(w < 0) or np.any(w.sum(axis=-1) <= 0):
    raise ValueError(f"{name} must be finite, non-negative, with a positive sum")
  return np.ascontiguousarray(np.broadcast_to(w, (n_runs, n_units)))


# ------------------------------------------------------------------------------- bootstrap


def _run_stats(scores: np.ndarray, weights: Optional[np.ndarray],
               counts: Optional[np.ndarray] = None) -> np.ndarray:
  """Per-run statistics, [n_runs] on the full data or [n_boot, n_runs] under unit `counts`
  ([n_boot, n_units], how often each unit was drawn)."""
  if counts is None:
    if weights is None:
      return scores.mean(axis=1)
    return scores.sum(axis=1) / weights.sum(axis=1)
  if weights is None:
    num, den = counts @ scores.T, counts.sum(axis=1, keepdims=True)
  else:
    num, den = np.split(counts @ np.concatenate([scores, weights]).T, 2, axis=1)
  with np.errstate(divide="ignore", invalid="ignore"):  # a resample of zero-weight units
    return num / den


def _unit_counts(rng: np.random.Generator, n_rows: int, n_units: int) -> np.ndarray:
  """How often each unit is drawn in n_rows resamples of n_units units: [n_rows, n_units]."""
  idx = rng.integers(0, n_units, size=(n_rows, n_units), dtype=np.int32)  # chunks < 2**31
  idx += np.arange(n_rows, dtype=np.int32)[:, None] * np.int32(n_units)
  return np.bincount(idx.ravel(), minlength=n_rows * n_units).reshape(n_rows, n_units).astype(
      np.float64)


def _seed_mean(rng: np.random.Generator, per_run: np.ndarray) -> np.ndarray:
  """The mean over a resample of the runs (columns of `per_run`), per replicate (row)."""
  n_rows, n_runs = per_run.shape
  if n_runs == 1:
    return per_run[:, 0]
  pick = rng.integers(0, n_runs, size=(n_rows, n_runs))
  return per_run[np.arange(n_rows)[:, None], pick].mean(axis=1)


def _contrast(a, b, contrast: str):
  if contrast == "difference":
    return a - b
  if contrast == "relative":
    return a / b - 1.0
  return np.expm1(a - b)


def _percentiles(boot: np.ndarray, ci: float, what: str):
  boot = boot[np.isfinite(boot)]
  if boot.size == 0:
    raise ValueError(f"{what}: no bootstrap replicate is finite (zero weights or B == 0?)")
  lo, hi = np.quantile(boot, [(1 - ci) / 2, (1 + ci) / 2])
  return float(lo), float(hi)


def paired_difference(a_runs: Sequence, b_runs: Sequence, *, weights=None,
                      contrast: str = "difference", n_boot: int = 2000, seed: int = 0,
                      ci: float = 0.95, paired: bool = True) -> Comparison:
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

  Returns:
    A Comparison; its null value is 0 for every contrast. See `verdict`. Replicates whose
    contrast is undefined (B's statistic 0 under "relative", a resample of zero-weight units
    only) are left out of the interval.

  Raises:
    ValueError: on no runs or no units, runs of different lengths, non-finite scores, bad
      weights, an unknown contrast, n_boot < 1 or ci outside (0, 1).
  """
  _check_options(n_boot, ci)
  if contrast not in CONTRASTS:
    raise ValueError(f"contrast must be one of {CONTRASTS}, got {contrast!r}")
  sa, sb = _as_runs(a_runs, "a_runs"), _as_runs(b_runs, "b_runs")
  if sa.shape[1] != sb.shape[1]:
    raise ValueError(f"a_runs have {sa.shape[1]} units, b_runs {sb.shape[1]}; A and B must be "
                     f"scored on the same units in the same order")
  n_units = sa.shape[1]
  if isinstance(weights, tuple) and len(weights) == 2 and np.ndim(weights[0]) >= 1:
    wa = _as_weights(weights[0], len(sa), n_units, "weights_a")
    wb = _as_weights(weights[1], len(sb), n_units, "weights_b")
  else:
    wa = _as_weights(weights, len(sa), n_units, "weights")
    wb = _as_weights(weights, len(sb), n_units, "weights")
  a, b = _run_stats(sa, wa).mean(), _run_stats(sb, wb).mean()
  rng = np.random.default_rng(seed)
  boot = np.empty(n_boot)
  step = max(1, _CHUNK_ELEMENTS // n_units)
  for start in range(0, n_boot, step):
    rows = min(step, n_boot - start)
    counts_a = _unit_counts(rng, rows, n_units)
    counts_b = counts_a if paired else _unit_counts(rng, rows, n_units)
    mean_a = _seed_mean(rng, _run_stats(sa, wa, counts_a))
    mean_b = _seed_mean(rng, _run_stats(sb, wb, counts_b))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
      boot[start:start + rows] = _contrast(mean_a, mean_b, contrast)
  lower, upper = _percentiles(boot, ci, "paired_difference")
  with np.errstate(divide="ignore", invalid="ignore"):
    estimate = float(_contrast(a, b, contrast))
  return Comparison(estimate=estimate, lower=lower, upper=upper, a=float(a), b=float(b),
                    contrast=contrast, ci=float(ci), n_seeds_a=len(sa), n_seeds_b=len(sb),
                    n_units=n_units, n_boot=int(n_boot), paired=bool(paired),
                    seed_spread_included=len(sa) > 1 and len(sb) > 1)


def mean_interval(runs: Sequence, *, weights=None, n_boot: int = 2000, seed: int = 0,
                  ci: float = 0.95) -> Interval:
  """One encoding's statistic (mean over its seeds) with a hierarchical bootstrap interval.

  Args:
    runs: one 1-D array of per-unit scores per seed, all on the same units in the same order.
    weights: None, or per-unit weights [n_units] (shared) or [n_runs, n_units]: the per-run
      statistic is then sum(scores) / sum(weights) (perplexity: the loss in nats per token;
      `Interval.transformed(math.exp)` gives the perplexity cell).
    n_boot, seed, ci: as in `paired_difference`.

  Returns:
    An Interval.

  Raises:
    ValueError: as `paired_difference`.
  """
  _check_options(n_boot, ci)
  scores = _as_runs(runs, "runs")
  n_runs, n_units = scores.shape
  w = _as_weights(weights, n_runs, n_units, "weights")
  rng = np.random.default_rng(seed)
  boot = np.empty(n_boot)
  step = max(1, _CHUNK_ELEMENTS // n_units)
  for start in range(0, n_boot, step):
    rows = min(step, n_boot - start)
    boot[start:start + rows] = _seed_mean(rng, _run_stats(scores, w,
                                                          _unit_counts(rng, rows, n_units)))
  lower, upper = _percentiles(boot, ci, "mean_interval")
  return Interval(estimate=float(_run_stats(scores, w).mean()), lower=lower, upper=upper,
                  ci=float(ci), n_seeds=n_runs, n_units=n_units, n_boot=int(n_boot),
                  seed_spread_included=n_runs > 1)
