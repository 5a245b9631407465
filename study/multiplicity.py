"""Many verdicts at once: Holm's and Benjamini-Hochberg's adjusted p-values, verdicts after
adjustment, and the seed-level tests behind every verdict: the paired t-test over seed pairs
and, beside it, the exact sign-flip (permutation) test over the same pairs.

The write-up makes one verdict per row of its claims table. Read one at a time, each row is a
95 % test; read together, the chance that some row "supports" by luck grows with the number
of rows. Holm's step-down adjustment keeps the chance of any false verdict in a family at or
below 5 % (family-wise error), Benjamini-Hochberg keeps the expected share of false ones
among the verdicts made at or below 5 % (false discovery rate). The study adjusts its short,
pre-registered family of primary comparisons with Holm and reports the exploratory rows with
their raw and Holm-adjusted verdicts (study/claims.py); the p-values adjusted are the paired
t-test's (study/verdicts.py).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

import numpy as np


def _check(p_values: Sequence[float]) -> np.ndarray:
  p = np.asarray(p_values, dtype=np.float64)
  if p.ndim != 1:
    raise ValueError(f"p-values must be a flat sequence, got shape {p.shape}")
  if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
    raise ValueError(f"p-values must lie in [0, 1], got {p_values!r}")
  return p


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values, in the input's order.

  The k-th smallest of m p-values is multiplied by m - k + 1; each adjusted value is at least
  the one before it in sorted order (monotone), and at most 1. A verdict whose adjusted
  p-value is below alpha keeps the family-wise error at alpha.
  """
  p = _check(p_values)
  m = p.size
  order = np.argsort(p, kind="stable")
  adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
  out = np.empty(m)
  out[order] = adjusted
  return out.tolist()


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
  """Benjamini-Hochberg adjusted p-values (q-values), in the input's order: the k-th smallest
  of m times m / k, made monotone from the largest down, at most 1."""
  p = _check(p_values)
  m = p.size
  order = np.argsort(p, kind="stable")
  scaled = p[order] * m / np.arange(1, m + 1)
  adjusted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
  out = np.empty(m)
  out[order] = adjusted
  return out.tolist()


def adjusted_verdict(raw: str, adjusted_p: Optional[float], alpha: float = 0.05) -> str:
  """The verdict after adjustment: a raw "supports" or "contradicts" stands when its adjusted
  p-value is below alpha and becomes "inconclusive" otherwise; other verdicts (inconclusive,
  at the floor, not measured) are kept as they are."""
  if raw not in ("supports", "contradicts") or adjusted_p is None:
    return raw
  return raw if adjusted_p < alpha else "inconclusive"


def paired_t(diffs: Sequence[float]) -> Optional[dict]:
  """The paired t-test over seed pairs: each pair's difference of the per-run statistic.

  Returns:
    {"n": pairs, "mean", "t", "df", "p": two-sided p-value, "lower", "upper": the 95 %
    t-interval of the mean difference}, or None with fewer than 2 pairs. With all differences
    equal (no spread), t is infinite and p is 0 unless the mean is 0.
  """
  from scipy import stats as sps  # a dependency of jax; only the write-up needs it

  d = np.asarray(diffs, dtype=np.float64)
  if d.size < 2:
    return None
  n, mean, sd = d.size, float(d.mean()), float(d.std(ddof=1))
  se = sd / math.sqrt(n)
  half = float(sps.t.ppf(0.975, n - 1)) * se
  if se == 0:
    t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
  else:
    t = mean / se
    p = float(2 * sps.t.sf(abs(t), n - 1))
  return {
    "n": n,
    "mean": mean,
    "t": t,
    "df": n - 1,
    "p": p,
    "lower": mean - half,
    "upper": mean + half,
  }


# Exact enumeration visits 2**n sign vectors: beyond this many pairs it is refused.
MAX_SIGN_FLIP_PAIRS = 20


def sign_flip(diffs: Sequence[float]) -> Optional[dict]:
  """The exact sign-flip (permutation) test over seed pairs: under "no difference" each pair's
  difference is as likely to have either sign, so the observed |mean| is compared with the
  |mean| of all 2**n sign vectors.

  Returns:
    {"n": pairs, "mean", "p": two-sided p-value (the share of the 2**n sign vectors whose
    |mean| is at least the observed one), "p_min": the smallest p any data could give with n
    pairs, 2 / 2**n}, or None with fewer than 2 pairs.

  Raises:
    ValueError: with more than MAX_SIGN_FLIP_PAIRS pairs (2**n vectors).
  """
  d = np.asarray(diffs, dtype=np.float64)
  if d.size < 2:
    return None
  if d.size > MAX_SIGN_FLIP_PAIRS:
    raise ValueError(
      f"sign_flip enumerates 2**n sign vectors; {d.size} pairs is more than {MAX_SIGN_FLIP_PAIRS}"
    )
  signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
  means = np.abs(signs @ d) / d.size
  observed = abs(float(d.mean()))
  # a relative tolerance: the observed vector's own |mean| must count despite rounding
  hits = int(np.sum(means >= observed * (1 - 1e-12) - 1e-300))
  return {
    "n": int(d.size),
    "mean": float(d.mean()),
    "p": hits / signs.shape[0],
    "p_min": 2 / signs.shape[0],
  }


def tost(diffs: Sequence[float], margin: float, alpha: float = 0.05) -> Optional[dict]:
  """Two one-sided t-tests over seed-pair differences against an equivalence margin +-margin
  (on the scale of the differences; the second study's in-distribution row: log perplexity
  ratios and margin log(1.01), study/preregistration_long.md).

  The two one-sided tests: p_low for H0 "mean <= -margin" (against "mean > -margin") and p_high
  for H0 "mean >= +margin" (against "mean < +margin"); equivalence when both reject, i.e. when
  p_equiv = max(p_low, p_high) < alpha (the (1 - 2 alpha) t-interval lies inside the margins).
  The same two statistics tested the other way round say whether the mean lies beyond a
  margin: p_below = 1 - p_low for H0 "mean >= -margin" (A lower by more than the margin) and
  p_above = 1 - p_high for H0 "mean <= +margin" (A higher by more than the margin).

  Returns:
    {"n", "mean", "df", "margin", "alpha", "p_low", "p_high", "p_equiv", "p_below", "p_above",
    "lower", "upper": the (1 - 2 alpha) t-interval of the mean, "outcome": "equivalent",
    "lower" (beyond -margin), "higher" (beyond +margin) or "inconclusive", "p": the p-value of
    the outcome reached (the smallest of p_equiv, p_below, p_above; at alpha < 0.5 at most one
    of them is below alpha)}, or None with fewer than 2 pairs.

  Raises:
    ValueError: a margin that is not positive, or alpha outside (0, 0.5).
  """
  from scipy import stats as sps

  if not margin > 0:
    raise ValueError(f"the equivalence margin must be positive, got {margin!r}")
  if not 0 < alpha < 0.5:
    raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
  d = np.asarray(diffs, dtype=np.float64)
  if d.size < 2:
    return None
  n, mean = d.size, float(d.mean())
  se, df = float(d.std(ddof=1)) / math.sqrt(n), n - 1
  if se == 0:  # no spread: each test is decided by the side of the mean
    p_low = 0.0 if mean > -margin else 1.0
    p_high = 0.0 if mean < margin else 1.0
  else:
    p_low = float(sps.t.sf((mean + margin) / se, df))
    p_high = float(sps.t.cdf((mean - margin) / se, df))
  half = float(sps.t.ppf(1 - alpha, df)) * se
  out = {
    "n": n,
    "mean": mean,
    "df": df,
    "margin": margin,
    "alpha": alpha,
    "p_low": p_low,
    "p_high": p_high,
    "p_equiv": max(p_low, p_high),
    "p_below": 1.0 - p_low,
    "p_above": 1.0 - p_high,
    "lower": mean - half,
    "upper": mean + half,
  }
  named = {"equivalent": out["p_equiv"], "lower": out["p_below"], "higher": out["p_above"]}
  reached = [k for k, p in named.items() if p < alpha]
  out["outcome"] = reached[0] if reached else "inconclusive"
  out["p"] = min(named.values())
  return out
