"""results/README.md's position-dependent retrieval sections: the retrieval study
(study.retrieval) run on the recall source's tasks whose answer depends on order or distance
(rove_jax.tasks.recall_tasks: "lastwrite", "offset"), each reported by length (the tables of
study.claims.retrieval, seed-paired) and by distance: accuracy against the distance from the
query to its answer, in buckets of the training length T, pooled over the test lengths.

Input per task: the study's recall.json content ({"records", "sample_distance", "spec", ...}).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from study import claims as claims_lib
from study import fmt, verdicts
from study import numbers as rs

TASK_NAMES = {
  "lastwrite": (
    "Position-dependent retrieval: last write wins",
    "variable tracking where a key is written more than once and the answer is "
    "its last value (rove_jax.tasks.recall_tasks, task=lastwrite)",
  ),
  "offset": (
    "Position-dependent retrieval: the token k after a marker",
    "retrieving the token at offset k after a marker (rove_jax.tasks.recall_tasks, task=offset)",
  ),
}
BUCKETS = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16))  # distance / T


def _bucket_label(lo, hi, T) -> str:
  return f"{lo * T}-{hi * T - 1}"


def distance_units(
  data: dict, encoding: str, setting: str, lo: int, hi: int, key: str = "sample_correct"
) -> Optional[rs.Units]:
  """One encoding's per-sample `key` over the test samples whose distance d satisfies
  lo * T <= d < hi * T (the last bucket includes d = hi * T), pooled over lengths (one stratum
  a length), one run per seed; None when no sample falls in the bucket or a seed lacks a
  length."""
  T = data["train_len"]
  dist = {int(L): np.asarray(d) for L, d in data["sample_distance"].items()}
  keep = {
    L: (d >= lo * T) & ((d < hi * T) | ((hi, lo) == BUCKETS[-1][::-1]) & (d <= hi * T))
    for L, d in dist.items()
  }
  lengths = [L for L in sorted(keep) if keep[L].any()]
  by_seed: dict = {}
  for r in data["records"]:
    if r["encoding"] == encoding and r["setting"] == setting:
      by_seed.setdefault(r["seed"], {})[int(r["length"])] = r
  seeds = sorted(by_seed)
  if not lengths or not seeds or any(L not in by_seed[s] for s in seeds for L in lengths):
    return None
  runs = [
    np.concatenate([np.asarray(by_seed[s][L][key], float)[keep[L]] for L in lengths]) for s in seeds
  ]
  strata = tuple(i for i, L in enumerate(lengths) for _ in range(int(keep[L].sum())))
  return rs.Units(tuple(runs), seeds=tuple(seeds), strata=strata)


def by_distance(data: dict, boot: rs.Boot) -> tuple[list, dict]:
  """(markdown lines, summary) of the accuracy by distance bucket: each encoding and setting,
  then RoVE - RoPE seed-paired with its verdict on "RoVE is higher"."""
  T = data["train_len"]
  encs = [e for e in rs.ORDER if any(r["encoding"] == e for r in data["records"])]
  settings = [s for s in claims_lib.SETTINGS if any(r["setting"] == s for r in data["records"])]
  buckets = [b for b in BUCKETS if distance_units(data, encs[0], "none", *b) is not None]
  chance = verdicts.recall_chance(data.get("spec"))
  head = (
    "| encoding | setting | "
    + " | ".join(f"distance {_bucket_label(lo, hi, T)}" for lo, hi in buckets)
    + " |"
  )
  L = [
    f"Accuracy by the distance from the query to its answer (tokens; every test length "
    f"pooled, T = {T}; chance {chance:.3g}):\n",
    head,
    "|---|---|" + "---|" * len(buckets),
  ]
  summary: dict = {}
  for e in encs:
    for s in settings:
      cells = [boot.cell(distance_units(data, e, s, *b)) for b in buckets]
      if all(c is None for c in cells):
        continue
      summary.setdefault(e, {})[s] = [
        None if c is None else [c.estimate, c.lower, c.upper] for c in cells
      ]
      L.append(
        f"| {fmt.name(e)} | {claims_lib.SETTINGS[s]} | "
        + " | ".join(fmt.fmt_interval(c) for c in cells)
        + " |"
      )
  if "rove" in encs and "rope" in encs:
    for s in settings:
      cells = [
        boot.compare(distance_units(data, "rove", s, *b), distance_units(data, "rope", s, *b))
        for b in buckets
      ]
      if all(c is None for c in cells):
        continue
      summary.setdefault("rove-rope", {})[s] = [
        None if c is None else [c.estimate, c.lower, c.upper] for c in cells
      ]
      floors = [
        rs.at_floor([rs.count(distance_units(data, e, s, *b)) for e in ("rove", "rope")], chance)
        for b in buckets
      ]
      L.append(
        f"| RoVE - RoPE | {claims_lib.SETTINGS[s]} | "
        + " | ".join(
          "-"
          if c is None
          else f"{fmt.fmt_change(c)} "
          + (verdicts.NOT_MEASURABLE if floor else rs.verdict(c, "higher"))
          for c, floor in zip(cells, floors)
        )
        + " |"
      )
  L.append("")
  return L, {"buckets": [list(b) for b in buckets], "accuracy": summary}


def distance_figure(tasks: dict) -> Optional[bytes]:
  """Accuracy against distance bucket, one panel a task, one line per encoding and setting
  (the mean over seeds); None without matplotlib data."""
  from rove_jax.evaluation import plots as eval_plots

  if not tasks:
    return None
  plt = eval_plots.pyplot()
  fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
  styles = {"none": "-", "yarn": "--", "yarn_fixed": ":"}
  for ax, (task, data) in zip(axes[0], tasks.items()):
    T = data["train_len"]
    for e in rs.ORDER:
      for s, style in styles.items():
        xs, ys = [], []
        for i, b in enumerate(BUCKETS):
          u = distance_units(data, e, s, *b)
          if u is not None:
            xs.append(i)
            ys.append(float(np.mean([np.mean(run) for run in u.scores])))
        if xs:
          ax.plot(
            xs,
            ys,
            style + "o",
            color=eval_plots.ENCODING_COLORS.get(e),
            ms=3,
            label=f"{fmt.name(e)}, {claims_lib.SETTINGS[s]}",
          )
    ax.set_xticks(
      range(len(BUCKETS)), [_bucket_label(lo, hi, T) for lo, hi in BUCKETS], rotation=20
    )
    ax.set(
      title=TASK_NAMES.get(task, (task,))[0].split(": ")[-1],
      xlabel="distance (tokens)",
      ylabel="accuracy",
      ylim=(0, 1.02),
    )
    ax.grid(alpha=0.3)
    eval_plots.legend(ax)
  fig.tight_layout()
  return eval_plots.png(fig, 110)


def task_study(data: dict, boot: rs.Boot) -> rs.Study:
  """A position task's records as a Study (no language-model runs), with its chance accuracy
  from the task's spec."""
  return rs.Study({"runs": []}, data["records"], boot, verdicts.recall_chance(data.get("spec")))


def section(tasks: dict, boot: rs.Boot, png_name: str) -> tuple[list, Optional[bytes], dict]:
  """(markdown lines, the by-distance PNG or None, summary) for {task: recall.json content}."""
  L, summary = [], {}
  for task, data in tasks.items():
    heading, what = TASK_NAMES.get(task, (f"Retrieval: {task}", task))
    md, _, by_length = claims_lib.retrieval(
      task_study(data, boot), png_name, heading=f"## {heading}", task=what
    )
    md = [line for line in md if not line.startswith("![")]  # one figure for every task
    dist_md, dist = by_distance(data, boot)
    L += md + dist_md
    summary[task] = {"spec": data.get("spec"), "by_length": by_length, "by_distance": dist}
  if L:
    L.append(
      "The verdicts in these tables are per cell and raw (the paired t-test over seed "
      "pairs, no adjustment). Each task's accuracy and answer NLL averaged over the "
      "lengths past T, per setting, are rows of the claims table's exploratory family, "
      "adjusted there with Holm.\n"
    )
  png = distance_figure(tasks)
  if png is not None and L:
    L.append(f"![accuracy by distance]({png_name})\n")
  return L, png, summary


def claim_rows(tasks: dict, boot: rs.Boot) -> list:
  """Each position task's claim rows (claims.recall_rows: accuracy and answer NLL past T,
  RoVE - RoPE, each setting), for the exploratory family of the claims table: their verdicts
  are then adjusted with the other exploratory rows'."""
  out = []
  for task, data in tasks.items():
    out += claims_lib.recall_rows(
      task_study(data, boot), f"position task {task} (not in the paper)"
    )
  return out


def load(paths: Sequence[tuple[str, str]]) -> dict:
  """{task: recall.json content} for the (task, path) pairs whose file exists."""
  import json
  import os

  out = {}
  for task, path in paths:
    if os.path.exists(path):
      with open(path) as f:
        out[task] = json.load(f)
  return out
