"""results/README.md's "Training length and learning rate" section: the checks reproduce.py
runs beside the main comparison, so that convergence speed and final quality are told apart
and neither encoding rests on one untuned learning rate.

  long  RoVE and RoPE on the first seeds again with k times the steps (their own schedule):
        per seed pair, the RoVE - RoPE differences at the main runs' steps and at k times them;
  lr    RoVE and RoPE at other learning rates: each run's final held-out loss beside the main
        run's at the config's rate, and the RoVE - RoPE gap at every rate.

Both are point estimates per seed pair; the training-length check adds, over its pairs, the
mean gap at each step count and its change, with paired-t intervals (`gap_lines`). The
held-out loss is the last `val_loss` of a run's metrics.jsonl; perplexities come from the
perplexity reports (the main report and the perplexity-only one of reproduce.py).
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

from study import multiplicity
from study.limits import _val_losses


def _kind(run: dict) -> str:
  """A plan entry's kind (reproduce.plan; runs without one are main runs)."""
  return run.get("kind", "main")


def _final_val(curves: dict, run: dict) -> Optional[float]:
  val = _val_losses(curves.get(run["workdir"]))
  return val[max(val)] if val else None


def _ppl_losses(report_run: Optional[dict], setting: str, train_len: int) -> tuple:
  """(loss at the training length, mean loss over the lengths above it) under a setting, or
  Nones."""
  ppl = (report_run or {}).get("perplexity") or {}
  cells = ppl.get(setting) or {}
  # at T every setting is the model as trained (YaRN's factor L / T is 1): the "none" cell
  inside = ((ppl.get("none") or {}).get(str(train_len)) or {}).get("loss")
  longer = [c["loss"] for L, c in cells.items() if int(L) > train_len and "loss" in c]
  return inside, (sum(longer) / len(longer) if longer else None)


def _pct(a: Optional[float], b: Optional[float]) -> str:
  """exp(a - b) - 1 as a signed percentage (the relative perplexity difference)."""
  return "-" if a is None or b is None else f"{100 * math.expm1(a - b):+.1f} %"


def _nats(a: Optional[float], b: Optional[float]) -> str:
  return "-" if a is None or b is None else f"{a - b:+.3f}"


def _by_workdir(reports: Sequence[Optional[dict]]) -> dict:
  return {os.path.abspath(r["workdir"]): r for rep in reports if rep for r in rep["runs"]}


def long_rows(
  runs: list,
  curves: dict,
  reports: Sequence[Optional[dict]],
  train_len: int,
  a: str = "rove",
  b: str = "rope",
) -> list[dict]:
  """One row per (seed, steps) of the training-length check: the main runs' and the long
  runs' RoVE - RoPE differences (held-out loss in nats, in-context and beyond-context
  perplexity in %, the latter as the geometric mean over the lengths above T)."""
  by_dir = _by_workdir(reports)
  index = {(_kind(r), r["encoding"], r["seed"]): r for r in runs if _kind(r) != "lr"}
  rows = []
  for seed in sorted({r["seed"] for r in runs if _kind(r) == "long"}):
    for kind in ("main", "long"):
      ra, rb = index.get((kind, a, seed)), index.get((kind, b, seed))
      if ra is None or rb is None:
        continue
      row = {
        "seed": seed,
        "steps": ra.get("steps") or "main",
        "val": (_final_val(curves, ra), _final_val(curves, rb)),
      }
      for setting in ("none", "yarn"):
        row[setting] = tuple(
          _ppl_losses(by_dir.get(os.path.abspath(r["workdir"])), setting, train_len)
          for r in (ra, rb)
        )
      rows.append(row)
  return rows


def lr_rows(
  runs: list, curves: dict, main_lr: float, a: str = "rove", b: str = "rope"
) -> list[dict]:
  """One row per (seed, learning rate), the config's rate (the main runs) included: each
  encoding's final held-out loss at it."""
  lr_runs = [r for r in runs if _kind(r) == "lr"]
  rows = []
  for seed in sorted({r["seed"] for r in lr_runs}):
    rates = {main_lr: {r["encoding"]: r for r in runs if _kind(r) == "main" and r["seed"] == seed}}
    for r in lr_runs:
      if r["seed"] == seed:
        rates.setdefault(r["lr"], {})[r["encoding"]] = r
    for lr in sorted(rates):
      val = {e: _final_val(curves, rates[lr][e]) if e in rates[lr] else None for e in (a, b)}
      rows.append({"seed": seed, "lr": lr, "main": lr == main_lr, "val": (val[a], val[b])})
  return rows


def gap_lines(longs: list, main_steps) -> list:
  """Across the seed pairs of the training-length check: the held-out gap's mean at the main
  runs' steps and at the long runs', and its change between them, each with the paired
  t-test's 95 % interval and p over the pairs ([] without 2 pairs with both)."""
  by_seed: dict = {}
  for r in longs:
    va, vb = r["val"]
    if va is not None and vb is not None:
      by_seed.setdefault(r["seed"], {})[r["steps"]] = va - vb
  pairs = [g for g in by_seed.values() if len(g) == 2]
  if len(pairs) < 2:
    return []
  long_steps = next(k for k in pairs[0] if k != "main")
  cells = {}
  for name, diffs in (
    ("main", [g["main"] for g in pairs]),
    ("long", [g[long_steps] for g in pairs]),
    ("change", [g[long_steps] - g["main"] for g in pairs]),
  ):
    t = multiplicity.paired_t(diffs)
    cells[name] = f"{t['mean']:+.3f} [{t['lower']:+.3f}, {t['upper']:+.3f}] (t p = {t['p']:.3g})"
  return [
    f"\nOver the {len(pairs)} seed pairs (mean, 95 % t-interval and paired t-test over "
    f"the pairs): the held-out gap is {cells['main']} nats at {main_steps} steps and "
    f"{cells['long']} at {long_steps}; its change from {main_steps} to {long_steps} "
    f"steps is {cells['change']}. A change of the opposite sign to the gap says the "
    f"gap shrinks with training."
  ]


def section(
  runs: list, curves: dict, reports: Sequence[Optional[dict]], meta: dict, train_len: int
) -> tuple[list, dict]:
  """(the markdown lines, the summary's "checks" entry); no lines when neither check ran."""
  train = meta.get("train") or {}
  longs = (
    long_rows(runs, curves, reports, train_len) if any(_kind(r) == "long" for r in runs) else []
  )
  lrs = lr_rows(runs, curves, train.get("lr")) if any(_kind(r) == "lr" for r in runs) else []
  if not longs and not lrs:
    return [], {}
  L = [
    "## Training length and learning rate\n",
    "Point estimates per seed pair (RoVE - RoPE; below 0: RoVE lower); the training-length "
    "check adds the mean over its pairs with a t-interval. Held-out loss: each run's last "
    "held-out evaluation (nats/token)"
    + (", each encoding at the learning rate its sweep chose" if meta.get("lr_sweep") else "")
    + ".\n",
  ]
  if longs:
    L += [
      f"**Training length.** The same seeds trained again with "
      f"{longs[-1]['steps']} steps on their own schedule (warm-up and decay over the longer "
      f"run) beside the main runs' {train.get('steps', '?')}. If the RoVE - RoPE gap "
      f"shrinks with training, the main comparison measures convergence speed more than "
      f"final quality.\n",
      "| seed | steps | held-out loss RoVE / RoPE | gap (nats) | perplexity at T | "
      "beyond T, no YaRN | beyond T, YaRN |",
      "|---|---|---|---|---|---|---|",
    ]
    for r in longs:
      va, vb = r["val"]
      steps = train.get("steps", "main") if r["steps"] == "main" else r["steps"]
      L.append(
        f"| {r['seed']} | {steps} | "
        f"{'-' if va is None else f'{va:.4f}'} / {'-' if vb is None else f'{vb:.4f}'} | "
        f"{_nats(va, vb)} | {_pct(r['none'][0][0], r['none'][1][0])} | "
        f"{_pct(r['none'][0][1], r['none'][1][1])} | "
        f"{_pct(r['yarn'][0][1], r['yarn'][1][1])} |"
      )
    L += gap_lines(longs, train.get("steps", "main"))
    L.append("")
  if lrs:
    L += [
      f"**Learning rate.** The main runs use {train.get('lr', '?'):g}; the check trains "
      f"the same seeds at the other rates with everything else equal.\n",
      "| seed | learning rate | held-out loss RoVE | RoPE | gap (nats) |",
      "|---|---|---|---|---|",
    ]
    for r in lrs:
      va, vb = r["val"]
      L.append(
        f"| {r['seed']} | {r['lr']:g}{' (main)' if r['main'] else ''} | "
        f"{'-' if va is None else f'{va:.4f}'} | {'-' if vb is None else f'{vb:.4f}'} | "
        f"{_nats(va, vb)} |"
      )
    best = {}
    for i, enc in enumerate(("RoVE", "RoPE")):
      scored = [(r["val"][i], r["lr"]) for r in lrs if r["val"][i] is not None]
      if scored:
        best[enc] = min(scored)[1]
    if best:
      L.append(
        "\nLowest held-out loss at: " + ", ".join(f"{e} {lr:g}" for e, lr in best.items()) + "."
      )
    L.append("")
  return L, {"long": longs, "lr": lrs}
