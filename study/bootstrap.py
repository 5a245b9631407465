"""The parts of study/stats.py's bootstrap: checks of its inputs (the runs' per-unit scores,
weights, strata and options), one chunk of replicates (how often each unit is drawn, which runs
are picked), the per-run statistics under those draws, the contrast, and what is read off the
replicates (percentile interval, Monte-Carlo errors of its endpoints, two-sided p-value).

study/stats.py's paired_difference and mean_interval put them together; they are the interface.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

# ------------------------------------------------------------------------------ validation


def check_options(n_boot: int, ci: float) -> None:
  if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
    raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
  if not isinstance(ci, (int, float)) or not 0 < ci < 1:
    raise ValueError(f"ci must lie strictly between 0 and 1, got {ci!r}")


def as_runs(runs, name: str) -> np.ndarray:
  """The runs' per-unit scores as a finite float64 array [n_runs, n_units]."""
  if isinstance(runs, np.ndarray) and runs.ndim == 1:
    raise ValueError(
      f"{name}: expected a list of runs (1-D arrays), got one 1-D array; "
      f"wrap a single run as [scores]"
    )
  runs = [np.asarray(r, dtype=np.float64) for r in runs]
  if not runs:
    raise ValueError(f"{name}: no runs")
  for i, r in enumerate(runs):
    if r.ndim != 1:
      raise ValueError(f"{name}[{i}]: per-unit scores must be 1-D, got shape {r.shape}")
    if r.size == 0:
      raise ValueError(f"{name}[{i}]: no units")
    if r.size != runs[0].size:
      raise ValueError(
        f"{name}: run {i} has {r.size} units, run 0 has {runs[0].size}; every "
        f"run must be scored on the same units in the same order"
      )
  runs = np.stack(runs)
  bad = np.flatnonzero(~np.isfinite(runs).all(axis=1))
  if bad.size:
    raise ValueError(f"{name}[{bad[0]}]: scores must be finite")
  return runs


def as_weights(weights, n_runs: int, n_units: int, name: str) -> Optional[np.ndarray]:
  """None, or positive weights broadcast to [n_runs, n_units]."""
  if weights is None:
    return None
  try:
    w = np.asarray(weights, dtype=np.float64)
  except ValueError:  # rows of different lengths
    raise ValueError(
      f"{name} must have shape ({n_units},) (shared by every run) or "
      f"({n_runs}, {n_units}) (one row per run); got rows of different "
      f"lengths"
    ) from None
  if w.shape not in ((n_units,), (n_runs, n_units)):
    raise ValueError(
      f"{name} must have shape ({n_units},) (shared by every run) or "
      f"({n_runs}, {n_units}) (one row per run), got {w.shape}"
    )
  if not np.all(np.isfinite(w)) or np.any(w < 0) or np.any(w.sum(axis=-1) <= 0):
    raise ValueError(f"{name} must be finite, non-negative, with a positive sum")
  return np.ascontiguousarray(np.broadcast_to(w, (n_runs, n_units)))


def as_strata(strata, n_units: int) -> Optional[list]:
  """None, or the unit indices of each stratum (labels [n_units], any hashable ints)."""
  if strata is None:
    return None
  labels = np.asarray(strata)
  if labels.shape != (n_units,):
    raise ValueError(f"strata must give one label per unit, shape ({n_units},), got {labels.shape}")
  return [np.flatnonzero(labels == v) for v in np.unique(labels)]


# ------------------------------------------------------------------------------- bootstrap


def run_stats(
  scores: np.ndarray, weights: Optional[np.ndarray], counts: Optional[np.ndarray] = None
) -> np.ndarray:
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


def unit_counts(
  rng: np.random.Generator, n_rows: int, n_units: int, strata: Optional[list] = None
) -> np.ndarray:
  """How often each unit is drawn in n_rows resamples of n_units units: [n_rows, n_units];
  with `strata` (index arrays) each stratum is resampled within itself."""
  groups = strata if strata is not None else [None]
  counts = np.empty((n_rows, n_units))
  for members in groups:
    k = n_units if members is None else len(members)
    idx = rng.integers(0, k, size=(n_rows, k), dtype=np.int32)  # chunks < 2**31
    idx += np.arange(n_rows, dtype=np.int32)[:, None] * np.int32(k)
    drawn = np.bincount(idx.ravel(), minlength=n_rows * k).reshape(n_rows, k)
    if members is None:
      counts[:] = drawn
    else:
      counts[:, members] = drawn
  return counts


def seed_pick(rng: np.random.Generator, n_rows: int, n_runs: int) -> Optional[np.ndarray]:
  """Resampled run indices per replicate [n_rows, n_runs]; None for a single run."""
  return None if n_runs == 1 else rng.integers(0, n_runs, size=(n_rows, n_runs))


def seed_mean(per_run: np.ndarray, pick: Optional[np.ndarray]) -> np.ndarray:
  """The mean over the picked runs (columns of `per_run`), per replicate (row)."""
  if pick is None:
    return per_run[:, 0]
  return per_run[np.arange(per_run.shape[0])[:, None], pick].mean(axis=1)


def apply_contrast(a, b, contrast: str):
  if contrast == "difference":
    return a - b
  if contrast == "relative":
    return a / b - 1.0
  return np.expm1(a - b)


def percentiles(boot: np.ndarray, ci: float, what: str):
  boot = boot[np.isfinite(boot)]
  if boot.size == 0:
    raise ValueError(f"{what}: no bootstrap replicate is finite (zero weights or B == 0?)")
  lo, hi = np.quantile(boot, [(1 - ci) / 2, (1 + ci) / 2])
  return float(lo), float(hi)


MC_BATCHES = 10


def mc_errors(boot: np.ndarray, ci: float) -> tuple:
  """Monte-Carlo standard errors of the percentile endpoints: the spread of the endpoints of
  MC_BATCHES disjoint batches of the replicates, / sqrt(MC_BATCHES) (a quantile's variance
  falls as 1 / replicates). None below 20 replicates a batch."""
  boot = boot[np.isfinite(boot)]
  n = boot.size // MC_BATCHES
  if n < 20:
    return None
  ends = np.quantile(
    boot[: n * MC_BATCHES].reshape(MC_BATCHES, n), [(1 - ci) / 2, (1 + ci) / 2], axis=1
  )
  se = ends.std(axis=1, ddof=1) / np.sqrt(MC_BATCHES)
  return float(se[0]), float(se[1])


def two_sided_p(boot: np.ndarray) -> float:
  """The percentile bootstrap's two-sided p-value for a contrast of 0: twice the smaller tail
  beyond 0, with the +1 correction of a Monte-Carlo test (never exactly 0)."""
  boot = boot[np.isfinite(boot)]
  below, above = (boot <= 0).sum(), (boot >= 0).sum()
  return float(min(1.0, 2 * (min(below, above) + 1) / (boot.size + 1)))
