"""The numbers of results/README.md with their intervals (study.writeup draws the tables).

Every cell and comparison comes from per-unit records gathered per run (seed) into `Units`
(study/units.py). `Boot` turns Units into a cell (stats.mean_interval) or a comparison
(stats.paired_difference) with one bootstrap setting; `Study` groups a report's runs by
encoding and computes every cell and comparison once.

Runs are paired across encodings by training seed (a report's "seed", else the N of a "-sN"
part of the run name): seed i of each encoding is resampled together
(stats.paired_difference's pair_seeds); an encoding with fewer seeds (NoPE) is compared on the
seeds both have.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Optional, Sequence

import numpy as np

from study import stats, verdicts
from study.units import (  # noqa: F401
  FLOOR,
  Units,
  at_ceiling,
  at_floor,
  count,
  icl_common_tasks,
  icl_samples,
  icl_units,
  pooled,
  pooled_strata,
  ppl_mean_units,
  ppl_units,
  recall_units,
  ruler_count,
  ruler_lengths,
  ruler_tasks,
  ruler_units,
)

# Replicates: stats reports the Monte-Carlo error of every endpoint, and the write-up flags a
# verdict that error could flip.
N_BOOT = 10000
CI = 0.95
BOOT_SEED = 0
# The measured coverage of the 95 % difference interval with paired seeds, by number of seed
# pairs: (encoding-by-seed sd, coverage %) on simulated runs (40 units, unit noise sd 1, a seed
# effect shared by the pair); bench/RESULTS.md has the measurement, tests check the quote.
COVERAGE = {
  3: (("0", "99"), ("0.1", "97.5"), ("0.22", "94.75"), ("0.5", "85"), ("1", "75")),
  8: (("0", "99.75"), ("0.1", "98.75"), ("0.22", "97"), ("0.5", "92.25"), ("1", "91.5")),
}


def coverage_quote(pairs: int) -> str:
  """'encoding-by-seed sd 0 / 0.1 / ...: 99 / 97.5 / ... %' for COVERAGE[pairs]."""
  rows = COVERAGE[pairs]
  return f"encoding-by-seed sd {' / '.join(s for s, _ in rows)}: {' / '.join(c for _, c in rows)} %"


class Boot:
  """Cells and comparisons with one bootstrap setting (replicates, seed, coverage)."""

  def __init__(self, n_boot: int = N_BOOT, seed: int = BOOT_SEED, ci: float = CI):
    self.n_boot, self.seed, self.ci = n_boot, seed, ci

  def cell(
    self, units: Optional[Units], transform: Optional[Callable[[float], float]] = None
  ) -> Optional[stats.Interval]:
    """stats.mean_interval of `units` (None stays None), under an increasing `transform`."""
    if units is None:
      return None
    weights = None if units.weights is None else np.stack(units.weights)
    iv = stats.mean_interval(
      list(units.scores),
      weights=weights,
      n_boot=self.n_boot,
      seed=self.seed,
      ci=self.ci,
      strata=units.strata,
    )
    return iv if transform is None else iv.transformed(transform)

  def compare(
    self, a: Optional[Units], b: Optional[Units], contrast: str = "difference"
  ) -> Optional[stats.Comparison]:
    """stats.paired_difference of A against B (None when either is missing). Runs of the same
    training seed are paired; when the two have different seed sets (NoPE trains on fewer),
    the comparison is over the seeds both have, paired, if there are at least 2."""
    if a is None or b is None:
      return None
    if a.seeds is not None and b.seeds is not None and a.seeds != b.seeds:
      common = [x for x in a.seeds if x in b.seeds]  # e.g. NoPE's 3 seeds of RoVE's 8
      if (
        len(common) >= 2 and len(set(a.seeds)) == len(a.seeds) and len(set(b.seeds)) == len(b.seeds)
      ):
        a, b = a.on_seeds(common), b.on_seeds(common)
    weights = None
    if a.weights is not None and b.weights is not None:
      weights = (np.stack(a.weights), np.stack(b.weights))
    elif a.weights is not None or b.weights is not None:
      raise ValueError("compare: both or neither statistic must be weighted")
    if a.strata != b.strata:
      raise ValueError("compare: both statistics must have the same strata")
    pair = a.seeds is not None and a.seeds == b.seeds
    return stats.paired_difference(
      list(a.scores),
      list(b.scores),
      weights=weights,
      contrast=contrast,
      n_boot=self.n_boot,
      seed=self.seed,
      ci=self.ci,
      pair_seeds=pair,
      strata=a.strata,
    )


# supports / contradicts / inconclusive from the paired t-test over seed pairs; "not measured"
verdict = verdicts.verdict  # for None (study/verdicts.py)


# ---------------------------------------------------------------------------------- study


ORDER = ("rove", "rope", "nope")


def run_seed(run: dict):
  """A run's training seed: its report's "seed", else the N of a "-sN" part of its name
  (reproduce.py's ENC-sN, ENC-sN-lrRATE, ENC-sN-stepsK-lrRATE), else its name (runs without
  seeds pair only by identical names)."""
  if run.get("seed") is not None:
    return int(run["seed"])
  m = re.search(r"-s(\d+)(?=-|$)", str(run.get("name", "")))
  return int(m.group(1)) if m else str(run.get("name"))


class Study:
  """A report's runs grouped by encoding (and retrieval-study records), with every cell and
  comparison computed once."""

  def __init__(
    self,
    report: dict,
    recall: Optional[Sequence[dict]] = None,
    boot: Optional[Boot] = None,
    recall_chance: float = 0.0,
  ):
    self.report, self.recall, self.boot = report, list(recall or []), boot or Boot()
    self.recall_chance = recall_chance  # the retrieval task's chance accuracy (verdicts)
    self.groups: dict = {}
    for run in report["runs"]:
      self.groups.setdefault(run["model"]["pos_encoding"], []).append(run)
    for runs in self.groups.values():  # seed order: seed i of every encoding is a pair
      runs.sort(key=lambda r: (isinstance(run_seed(r), str), run_seed(r)))
    self.seeds = {e: tuple(run_seed(r) for r in runs) for e, runs in self.groups.items()}
    self.order = [e for e in ORDER if e in self.groups] + sorted(
      e for e in self.groups if e not in ORDER
    )
    self._cache: dict = {}

  def _once(self, key, fn):
    if key not in self._cache:
      self._cache[key] = fn()
    return self._cache[key]

  def pairs(self, encodings: Optional[Sequence[str]] = None) -> list:
    """The comparisons: RoVE against RoPE, then against NoPE, those present."""
    have = self.order if encodings is None else encodings
    return [("rove", b) for b in ("rope", "nope") if "rove" in have and b in have]

  # perplexity
  def _seeded(self, enc, units: Optional[Units], runs=None) -> Optional[Units]:
    """units with the seeds of `runs` (default: every run of the encoding)."""
    seeds = self.seeds[enc] if runs is None else tuple(run_seed(r) for r in runs)
    return None if units is None else dataclasses.replace(units, seeds=seeds)

  def ruler_runs(self, enc, setting) -> list:
    """The encoding's runs that RULER scored under the setting (a perplexity-only
    evaluation of added seeds has none)."""
    return [r for r in self.groups[enc] if ruler_tasks(r, setting)]

  def icl_runs(self, enc) -> list:
    """The encoding's runs with synthetic ICL records."""
    return [r for r in self.groups[enc] if icl_samples(r)]

  def ppl_units(self, enc, setting, length) -> Optional[Units]:
    return self._once(
      ("ppl", enc, setting, length),
      lambda: self._seeded(enc, ppl_units(self.groups[enc], setting, length)),
    )

  def loss(self, enc, setting, length):
    return self._once(
      ("loss", enc, setting, length), lambda: self.boot.cell(self.ppl_units(enc, setting, length))
    )

  def ppl(self, enc, setting, length):
    return self._once(
      ("ppl_iv", enc, setting, length),
      lambda: self.boot.cell(self.ppl_units(enc, setting, length), math.exp),
    )

  def ppl_cmp(self, a, b, setting, length):
    return self._once(
      ("ppl_cmp", a, b, setting, length),
      lambda: self.boot.compare(
        self.ppl_units(a, setting, length), self.ppl_units(b, setting, length), "exp"
      ),
    )

  def ppl_mean_cmp(self, a, b, setting, lengths):
    """exp(mean over `lengths` of the A - B mean window loss) - 1: the geometric-mean
    perplexity ratio - 1 over those lengths."""
    lengths = tuple(lengths)
    units = {
      e: self._once(
        ("ppl_mean", e, setting, lengths),
        lambda e=e: self._seeded(e, ppl_mean_units(self.groups[e], setting, lengths)),
      )
      for e in (a, b)
    }
    return self._once(
      ("ppl_mean_cmp", a, b, setting, lengths), lambda: self.boot.compare(units[a], units[b], "exp")
    )

  def _ppl_mix(self, enc, setting, length, keep):
    """Units of loss(setting) - keep * loss(none) per run (the same windows)."""
    y, n = self.ppl_units(enc, setting, length), self.ppl_units(enc, "none", length)
    return None if y is None or n is None else y.scaled(n, 1.0, -keep)

  def yarn_change(self, enc, setting, length):
    """A YaRN setting against none within the same runs: ppl ratio - 1 (seeds paired)."""
    return self._once(
      ("yarn_change", enc, setting, length),
      lambda: self.boot.cell(self._ppl_mix(enc, setting, length, 1.0), math.expm1),
    )

  def gap_kept(self, setting, length, keep: float = 0.5):
    """(RoVE - RoPE loss with YaRN) - keep * (the same without): below 0 when the gap with
    YaRN is more than `keep` of the gap without (both gaps negative, RoVE lower)."""
    return self._once(
      ("gap_kept", setting, length, keep),
      lambda: self.boot.compare(
        self._ppl_mix("rove", setting, length, keep), self._ppl_mix("rope", setting, length, keep)
      ),
    )

  # RULER
  def ruler_encodings(self, setting) -> list:
    return [e for e in self.order if self.ruler_runs(e, setting)]

  def ruler_lengths(self, setting) -> dict:
    """{task: lengths} scored by every run of every encoding scored under the setting."""
    return self._once(
      ("ruler_lengths", setting),
      lambda: ruler_lengths(
        [r for e in self.ruler_encodings(setting) for r in self.ruler_runs(e, setting)], setting
      ),
    )

  def _ruler(self, enc, setting, coefs_key, key):
    coefs = self.ruler_coefs(setting, coefs_key)
    runs = self.ruler_runs(enc, setting)
    return self._once(
      ("ruler_units", enc, setting, coefs_key, key),
      lambda: self._seeded(
        enc, ruler_units(runs, setting, coefs, self.ruler_lengths(setting), key), runs
      ),
    )

  def ruler_coefs(self, setting, which) -> dict:
    """Task coefficients: a task name (that task), "mean" (mean over tasks), "agg" / "other"
    (mean over the AGGREGATION tasks / the others) or "agg-other" (the first minus the
    second); {} when a group is empty."""
    tasks = list(self.ruler_lengths(setting))
    agg = [t for t in tasks if t in AGGREGATION]
    groups = {"mean": tasks, "agg": agg, "other": [t for t in tasks if t not in AGGREGATION]}
    if which in groups:
      return {t: 1 / len(groups[which]) for t in groups[which]}
    if which == "agg-other":
      if not agg or not groups["other"]:
        return {}
      return {
        **self.ruler_coefs(setting, "agg"),
        **{t: -c for t, c in self.ruler_coefs(setting, "other").items()},
      }
    return {which: 1.0} if which in tasks else {}

  def ruler_nll(self, enc, setting, which):
    return self._once(
      ("ruler_nll", enc, setting, which),
      lambda: self.boot.cell(self._ruler(enc, setting, which, "sample_nll")),
    )

  def ruler_cmp(self, a, b, setting, which):
    return self._once(
      ("ruler_cmp", a, b, setting, which),
      lambda: self.boot.compare(
        self._ruler(a, setting, which, "sample_nll"), self._ruler(b, setting, which, "sample_nll")
      ),
    )

  def ruler_count(self, enc, setting, which) -> Optional[tuple[int, int]]:
    lengths = self.ruler_lengths(setting)
    tasks = {t: lengths[t] for t in self.ruler_coefs(setting, which)}
    return ruler_count(self.ruler_runs(enc, setting), setting, tasks) if tasks else None

  # ICL
  def icl_tasks(self) -> list:
    return self._once(
      "icl_tasks",
      lambda: icl_common_tasks([runs for runs in (self.icl_runs(e) for e in self.order) if runs]),
    )

  def icl_units(self, enc, tasks, index):
    tasks = tuple(tasks)
    runs = self.icl_runs(enc)
    return self._once(
      ("icl_units", enc, tasks, index),
      lambda: self._seeded(enc, icl_units(runs, tasks, index), runs),
    )

  def icl_nll(self, enc, tasks):
    return self._once(
      ("icl_nll", enc, tuple(tasks)), lambda: self.boot.cell(self.icl_units(enc, tasks, 0))
    )

  def icl_count(self, enc, tasks):
    return count(self.icl_units(enc, tasks, 1))

  def icl_cmp(self, a, b, tasks, index):
    return self._once(
      ("icl_cmp", a, b, tuple(tasks), index),
      lambda: self.boot.compare(self.icl_units(a, tasks, index), self.icl_units(b, tasks, index)),
    )

  # retrieval study
  def recall_units(self, enc, setting, lengths, key):
    lengths = tuple(lengths)
    return self._once(
      ("recall_units", enc, setting, lengths, key),
      lambda: recall_units(self.recall, enc, setting, lengths, key),
    )

  def recall_cell(self, enc, setting, lengths, key):
    return self._once(
      ("recall_cell", enc, setting, tuple(lengths), key),
      lambda: self.boot.cell(self.recall_units(enc, setting, lengths, key)),
    )

  def recall_cmp(self, a, b, setting, lengths, key):
    return self._once(
      ("recall_cmp", a, b, setting, tuple(lengths), key),
      lambda: self.boot.compare(
        self.recall_units(a, setting, lengths, key), self.recall_units(b, setting, lengths, key)
      ),
    )


# RULER's aggregation category (Hsieh et al. 2024): common and frequent words extraction.
AGGREGATION = ("cwe", "fwe")
