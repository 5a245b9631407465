"""Per-unit records gathered per run (seed) into `Units`, the input of every cell and comparison
of results/README.md (study.numbers): perplexity windows (report PPL_ROW window_nll /
window_tokens), RULER samples (sample_nll / sample_correct), ICL samples
(sample_nll_by_AXIS / sample_correct_by_AXIS) and retrieval-study samples (records'
sample_nll / sample_correct), with the counts and floor / ceiling rules on them.

A statistic that averages several cells (RULER's mean over lengths, the mean over tasks, a
difference between task groups) is a fixed linear combination of per-unit means; `pooled`
writes it as the plain mean of rescaled unit scores, and `pooled_strata` labels each unit
with its cell, so the bootstrap resamples within cells and every replicate keeps the
combination's coefficients.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from study import verdicts

# Accuracy above 1 - FLOOR for every compared encoding is "at the ceiling": counts, no verdict
# (the floor is chance + study.verdicts.MARGIN: "not measurable at this scale").
FLOOR = 0.05


@dataclasses.dataclass(frozen=True)
class Units:
  """One encoding's per-unit scores for one statistic: one array per run (seed), all on the
  same units in the same order; with `weights` the statistic is sum(scores) / sum(weights).
  `seeds` names each run's training seed (pairing across encodings); `strata` labels each
  unit with its cell (task, length) for stratified resampling."""

  scores: tuple
  weights: Optional[tuple] = None
  seeds: Optional[tuple] = None
  strata: Optional[tuple] = None

  @property
  def n_runs(self) -> int:
    return len(self.scores)

  @property
  def n_units(self) -> int:
    return len(self.scores[0])

  def on_seeds(self, seeds: Sequence) -> "Units":
    """The runs of `seeds` (each in self.seeds), in that order."""
    idx = [self.seeds.index(s) for s in seeds]
    pick = lambda xs: None if xs is None else tuple(xs[i] for i in idx)  # noqa: E731
    return dataclasses.replace(
      self, scores=pick(self.scores), weights=pick(self.weights), seeds=tuple(seeds)
    )

  def scaled(self, other: "Units", a: float, b: float) -> "Units":
    """a * self + b * other, unit by unit (same runs, units and weights)."""
    if self.n_runs != other.n_runs or self.n_units != other.n_units:
      raise ValueError("combined statistics need the same runs and units")
    return Units(
      tuple(a * x + b * y for x, y in zip(self.scores, other.scores)),
      self.weights,
      self.seeds,
      self.strata,
    )


def _arrays(lists) -> tuple:
  return tuple(np.asarray(x, dtype=np.float64) for x in lists)


def pooled(parts: Sequence[tuple[float, Sequence]]) -> tuple:
  """Per-run scores whose plain mean is sum_p coef_p * mean(part_p).

  Args:
    parts: (coef, per-run lists of unit scores) per part; every part has the same runs.

  Returns:
    One array per run: the parts' scores concatenated, each scaled by coef * N / n_part.
  """
  n_runs = {len(runs) for _, runs in parts}
  if len(n_runs) != 1:
    raise ValueError("every part needs the same runs")
  out = []
  for i in range(n_runs.pop()):
    arrays = [(c, np.asarray(runs[i], dtype=np.float64)) for c, runs in parts]
    total = sum(len(x) for _, x in arrays)
    out.append(np.concatenate([x * (c * total / len(x)) for c, x in arrays]))
  return tuple(out)


def pooled_strata(parts: Sequence[tuple[float, Sequence]]) -> tuple:
  """The part (stratum) index of every unit of `pooled(parts)`."""
  return tuple(i for i, (_, runs) in enumerate(parts) for _ in range(len(runs[0])))


def ppl_units(runs: Sequence[dict], setting: str, length: int) -> Optional[Units]:
  """Per-window summed NLLs weighted by window tokens, or None unless every run has them."""
  rows = [((r.get("perplexity") or {}).get(setting) or {}).get(str(length)) for r in runs]
  if not runs or any(not isinstance(row, dict) or not row.get("window_nll") for row in rows):
    return None
  return Units(
    _arrays(row["window_nll"] for row in rows), _arrays(row["window_tokens"] for row in rows)
  )


def ppl_mean_units(runs: Sequence[dict], setting: str, lengths: Sequence[int]) -> Optional[Units]:
  """The mean over `lengths` of each length's mean window loss (window NLL / its tokens), one
  stratum a length; None unless every run has every length."""
  parts = []
  for length in lengths:
    units = ppl_units(runs, setting, length)
    if units is None:
      return None
    parts.append((1 / len(lengths), [x / w for x, w in zip(units.scores, units.weights)]))
  return Units(pooled(parts), strata=pooled_strata(parts)) if parts else None


def ruler_tasks(run: dict, setting: str) -> dict:
  """{task: {length str: RULER_ROW}} of one run under a setting ({} when not scored)."""
  entry = ((run.get("ruler") or {}).get("settings") or {}).get(setting) or {}
  return entry.get("tasks") or {}


def ruler_lengths(runs: Sequence[dict], setting: str) -> dict:
  """{task: sorted lengths that every run scored under the setting} (tasks all runs have)."""
  maps = [ruler_tasks(r, setting) for r in runs]
  if not runs or not all(maps):
    return {}
  tasks = set.intersection(*(set(m) for m in maps))
  out = {t: sorted(set.intersection(*(set(int(L) for L in m[t]) for m in maps))) for t in tasks}
  return {t: ls for t, ls in sorted(out.items()) if ls}


def ruler_units(
  runs: Sequence[dict], setting: str, coefs: dict, lengths: dict, key: str = "sample_nll"
) -> Optional[Units]:
  """Units of sum_task coefs[task] * (mean over the task's lengths of the per-length mean).

  Args:
    runs: the runs of one encoding.
    setting: "none" or "yarn".
    coefs: {task: coefficient}, e.g. {task: 1} (one task) or 1 / n_tasks each (mean).
    lengths: {task: lengths}, from `ruler_lengths` over every run being compared.
    key: "sample_nll" or "sample_correct".
  """
  parts = []
  for task, c in coefs.items():
    for L in lengths.get(task, ()):
      rows = [ruler_tasks(r, setting).get(task, {}).get(str(L)) for r in runs]
      if any(row is None or not row.get(key) for row in rows):
        return None
      parts.append((c / len(lengths[task]), [row[key] for row in rows]))
  return Units(pooled(parts), strata=pooled_strata(parts)) if parts and runs else None


def ruler_count(runs: Sequence[dict], setting: str, tasks: dict) -> tuple[int, int]:
  """(exact matches, samples) over the runs, the given tasks and their lengths."""
  k = n = 0
  for r in runs:
    for task, lengths in tasks.items():
      for L in lengths:
        row = ruler_tasks(r, setting)[task][str(L)]
        k, n = k + int(sum(row["sample_correct"])), n + len(row["sample_correct"])
  return k, n


def icl_samples(run: dict) -> dict:
  """{task: (sample NLLs, sample correct)} of a run's synthetic ICL, each task's lists
  concatenated over its axis values (lengths or shot counts) in numeric order."""
  tasks = ((run.get("icl") or {}).get("synthetic") or {}).get("tasks") or {}
  out = {}
  for task, row in sorted(tasks.items()):
    nll, right = [], []
    for key in sorted(k for k in row if k.startswith("sample_nll_by_")):
      axis = key[len("sample_nll_by_") :]
      by_v, correct = row[key], row.get(f"sample_correct_by_{axis}") or {}
      for v in sorted(by_v, key=lambda s: (len(s), s)):
        nll += list(by_v[v])
        right += list(correct.get(v, ()))
    if nll and len(nll) == len(right):
      out[task] = (nll, right)
  return out


def icl_units(runs: Sequence[dict], tasks: Sequence[str], index: int) -> Optional[Units]:
  """Units pooled over the samples of `tasks` (index 0: answer NLL, 1: correct)."""
  per_run = [icl_samples(r) for r in runs]
  if not runs or not tasks or any(t not in s for s in per_run for t in tasks):
    return None
  strata = tuple(i for i, t in enumerate(tasks) for _ in per_run[0][t][index])
  return Units(_arrays([x for t in tasks for x in s[t][index]] for s in per_run), strata=strata)


def icl_common_tasks(groups: Sequence[Sequence[dict]]) -> list:
  """The synthetic ICL tasks that every run of every group scored."""
  sets = [set(icl_samples(r)) for runs in groups for r in runs]
  return sorted(set.intersection(*sets)) if sets else []


def count(units: Optional[Units]) -> Optional[tuple[int, int]]:
  """(correct, samples) summed over the runs of 0/1 units."""
  if units is None:
    return None
  return int(sum(x.sum() for x in units.scores)), units.n_runs * units.n_units


def at_ceiling(counts: Sequence[Optional[tuple[int, int]]]) -> bool:
  """Whether every count's accuracy is above 1 - FLOOR: (nearly) every answer right, where a
  difference in accuracy or answer NLL measures nothing (missing counts are ignored)."""
  got = [c for c in counts if c is not None and c[1]]
  return bool(got) and all(k / n > 1 - FLOOR for k, n in got)


def at_floor(counts: Sequence[Optional[tuple[int, int]]], chance: float = 0.0) -> bool:
  """Whether every count's accuracy is within study.verdicts.MARGIN of `chance` (missing
  counts are ignored): not measurable at this scale."""
  return verdicts.near_chance(counts, chance)


def recall_units(
  records: Sequence[dict], encoding: str, setting: str, lengths: Sequence[int], key: str
) -> Optional[Units]:
  """A retrieval-study statistic of one encoding: the mean over `lengths` of the per-length
  mean of `key` ("sample_nll" or "sample_correct"), one run per seed."""
  cells = {}
  for rec in records:
    if rec["encoding"] == encoding and rec["setting"] == setting:
      cells.setdefault(rec["seed"], {})[int(rec["length"])] = rec
  seeds = sorted(cells, key=str)
  if not seeds or any(
    L not in cells[s] or not cells[s][L].get(key) for s in seeds for L in lengths
  ):
    return None
  parts = [(1 / len(lengths), [cells[s][L][key] for s in seeds]) for L in lengths]
  return Units(pooled(parts), seeds=tuple(seeds), strata=pooled_strata(parts))
