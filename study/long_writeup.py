"""results/long/README.md for the second study (study/long_study.py, preregistered in
study/preregistration_long.md), from the committed records of results/long alone (reports/,
metrics/, lr_sweep.json, timings.json, invocations.json): study.long_rows computes the numbers.

Until every primary pair is evaluated it is a progress report: the runs trained and evaluated,
the sweep's table and the rate-sensitivity rows (exploratory, from the sweep's own runs), and
no number, verdict, interval or p-value of the comparison (the preregistration's stopping
rule). Once all 10 pairs are in: the primary family with Holm over its rows, the perplexity
tables, the exploratory rows, the gap against training steps (gap_vs_steps.png), every run and
the closing note.
"""

from __future__ import annotations

import json
import os
import subprocess

from study import fmt, long_plan, multiplicity, plots, primary, sweep
from study import long_rows as lr

README = "README.md"
PLOT = "gap_vs_steps.png"
PREREG = "study/preregistration_long.md"


def prereg_commit() -> str:
  """'HASH at DATE' of the commit that added the preregistration, or '?' outside git."""
  try:
    out = subprocess.run(
      ["git", "log", "--diff-filter=A", "--format=%H at %cI", "--", PREREG],
      cwd=long_plan.ROOT,
      capture_output=True,
      text=True,
    ).stdout.split("\n")
    return out[-2] if len(out) > 1 else "?"  # the oldest: the commit that added it
  except OSError:
    return "?"


def _read(out, name, default=None):
  path = os.path.join(out, name)
  if not os.path.exists(path):
    return default
  with open(path) as f:
    return json.load(f)


def _table(rows: list, holm: bool = True) -> list[str]:
  L = [
    "| # | the paper's claim (where) | test here | figure [95 % interval] | seed-level tests "
    "| verdict | after Holm |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    L.append(
      f"| {r['id']} | {r['claim']} | {r['test']} | {r['figure']} | {primary.t_cell(r)} "
      f"| {r['verdict']} | {r.get('verdict_holm', '-') if holm else '-'} |"
    )
  return L


def _runs_table(runs: list, timings: dict, show_losses: bool) -> list[str]:
  L = [
    "| run | kind | encoding | seed | learning rate | final held-out loss | wall (min, "
    "training and evaluation) |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in runs:
    val = [row["val_loss"] for row in r["curve"] if "val_loss" in row]
    shown = f"{val[-1]:.4f}" if val and (show_losses or r["kind"] == "sweep") else "-"
    secs = timings.get(r["key"]) or []
    L.append(
      f"| {r['key']} | {r['kind']} | {fmt.name(r['encoding'])} | {r['seed']} | "
      f"{r['lr']:g} | {shown} | {f'{sum(secs) / 60:.1f}' if secs else '-'} |"
    )
  return L


def _ppl_tables(st) -> list[str]:
  lengths = sorted(
    {int(k) for r in st.report["runs"] for k in r["perplexity"]["none"] if k.isdigit()}
  )
  head = " | ".join(f"{L} ({fmt.mult(L, lr.T)})" for L in lengths)
  L = [f"| encoding | setting | {head} |", "|---|---|" + "---|" * len(lengths)]
  for enc in ("rove", "rope"):
    for s in ("none", "yarn"):
      L.append(
        f"| {fmt.name(enc)} | {fmt.SETTING_NAMES[s]} | "
        + " | ".join(fmt.fmt_interval(st.ppl(enc, s, x)) for x in lengths)
        + " |"
      )
  for s in ("none", "yarn"):
    L.append(
      f"| RoVE - RoPE | {fmt.SETTING_NAMES[s]} | "
      + " | ".join(fmt.fmt_change(st.ppl_cmp("rove", "rope", s, x)) for x in lengths)
      + " |"
    )
  return L, lengths


def _steps_lines(gaps: dict, out: str) -> list[str]:
  png = plots.gap_vs_steps(gaps, margin=lr.MARGIN)  # P1's +-1 %, in nats
  if png:
    with open(os.path.join(out, PLOT), "wb") as f:
      f.write(png)
  L = ["| step | " + " | ".join(str(s) for s in gaps) + " |", "|---|" + "---|" * len(gaps)]
  cells = []
  for diffs in gaps.values():
    t = multiplicity.paired_t(diffs)
    cells.append(
      f"{t['mean']:+.3f} [{t['lower']:+.3f}, {t['upper']:+.3f}] ("
      f"{sum(d < 0 for d in diffs)}/{len(diffs)} below 0)"
      if t
      else "-"
    )
  L.append(
    "| RoVE - RoPE held-out loss (nats), mean [95 % t-interval] | " + " | ".join(cells) + " |"
  )
  return L + ["", f"![gap against training steps]({PLOT})", ""]


def write(out: str, runs_dir: str) -> str:
  """Writes <out>/README.md (and gap_vs_steps.png once complete); returns its path."""
  rec = sweep.load_record(out) or {}
  runs = lr.load(out)
  timings = _read(out, "timings.json", {})
  chosen = {e: float(x) for e, x in (rec.get("chosen") or {}).items()}
  seeds = lr.complete_pairs(runs, "primary", chosen) if chosen and not rec.get("refused") else []
  done = len(seeds) >= len(long_plan.SEEDS)
  seeds = seeds[: len(long_plan.SEEDS)]  # the first 10 complete pairs, in seed order
  L = [
    "# Second study: RoVE vs RoPE at 2,000 steps" + ("" if done else " (in progress)") + "\n",
    f"Pre-registered in [{PREREG}](../../{PREREG}), committed on its own in "
    f"{prereg_commit()}, before any of this study's runs trained. Every run: the first "
    f"study's 4-layer byte-level GPT (834,304 parameters, 128-token context, batch 16 x 128 "
    f"tokens) trained for {long_plan.STEPS:,} steps (4.10 M tokens, 4.9 tokens per "
    f"parameter); RoVE and RoPE only (NoPE is not part of this study). Command: `make "
    f"reproduce-long` (study/long_study.py; reruns resume). Records: reports/ (each run's "
    f"perplexity report), metrics/ (its training metrics), lr_sweep.json, timings.json "
    f"(seconds a run took to train and evaluate, in the invocation that finished it), "
    f"invocations.json.\n",
  ]
  st_ = long_plan.status(out, runs_dir)
  L += ["## Progress\n"] + [
    f"- {k}: {d} of {n} runs trained and evaluated" for k, (d, n) in st_.items()
  ]
  inv = _read(out, "invocations.json", [])
  if inv:
    import datetime

    first = datetime.datetime.fromtimestamp(inv[0]["started"], datetime.timezone.utc)
    try:
      registered = datetime.datetime.fromisoformat(prereg_commit().split(" at ")[1])
      order = "after" if first > registered else "BEFORE"
    except (IndexError, ValueError):
      order = "unknown against"
    L.append(
      f"- invocations: {len(inv)}, the first started {first.isoformat()} ({order} the "
      f"preregistration's commit); {wall_minutes(out):.0f} min of wall time so far; "
      f"code " + ", ".join(sorted({i["commit"] for i in inv}))
    )
  if not done:
    L.append(
      "\nUntil all 10 seed pairs are evaluated this page reports no number, interval or "
      "p-value of the comparison (the preregistration's stopping rule)."
    )
  L.append("")
  if rec:
    L += sweep.section(rec)
  grids = (rec.get("meta") or {}).get("grids") or {}
  grids = {e: [float(x) for x in g] for e, g in grids.items()}
  sens = lr.adjust(lr.sensitivity(runs, chosen, grids)) if chosen and grids else []
  if sens:
    L += [
      "## Rate sensitivity (exploratory)\n",
      "The sweep's own seed pairs at the chosen rate and the rates next to it, no YaRN: "
      "does the out-of-distribution verdict depend on the rate? 2 pairs a rate, so the "
      f"tests are nearly powerless (Holm over these {len(sens)} rows).\n",
      *_table(sens),
      "",
    ]
  if done:
    L += _results(out, runs, chosen, seeds)
  L += ["## Every run\n", *_runs_table(runs, timings, done), ""]
  path = os.path.join(out, README)
  with open(path, "w") as f:
    f.write("\n".join(L) + "\n")
  return path


def _results(out, runs, chosen, seeds) -> list[str]:
  st = lr.study(runs, "primary", chosen, seeds)
  fam = lr.adjust(lr.family(st))
  ppl, lengths = _ppl_tables(st)
  expl = lr.adjust(lr.exploratory(st, lengths))
  L = [
    f"## Primary family (Holm over {primary.family_size(fam)} rows)\n",
    f"RoVE against RoPE at their chosen rates ("
    f"{', '.join(f'{fmt.name(e)} {x:g}' for e, x in chosen.items())}), "
    f"{len(seeds)} seed pairs (seeds {seeds[0]}-{seeds[-1]}). Verdicts from the seed-level "
    f"tests (P1: two one-sided t-tests against +-1 %; P2-P4, P7: paired t on RoVE lower; P5, "
    f"P6: one-sample t of each encoding's 16x / T log ratio against 0); the bootstrap "
    f"interval is the effect's.\n",
    *_table(fam),
    "",
  ]
  share = lr.yarn_share(st)
  L += [
    "## Perplexity by evaluation length\n",
    *ppl,
    "",
    "How much of the gap YaRN keeps (exploratory; the gap with YaRN over the gap without, "
    "mean log-perplexity gaps over the pairs; 1: all of it): "
    + ", ".join(f"{v:.2f} at {fmt.mult(L, lr.T)}" for L, v in share.items())
    + ".\n",
  ]
  L += [f"## Exploratory rows (Holm over {primary.family_size(expl)} rows)\n", *_table(expl), ""]
  steps_lines = _steps_lines(lr.gap_by_step(runs, chosen, seeds), out)
  L += [
    "## The gap against training steps (exploratory)\n",
    "Per seed pair, RoVE - RoPE held-out loss (16 batches) every 200 steps; the first "
    "study's gap over 8 pairs was -0.049, -0.037, -0.027 nats at steps 100, 200, 300 of its "
    "300-step schedule (a different schedule: quoted, not pooled).\n",
    *steps_lines,
  ]
  return L + _closing(fam, out)


def wall_minutes(out: str) -> float:
  """The study's wall time so far: the sum over invocations of until - started."""
  return sum(i["until"] - i["started"] for i in _read(out, "invocations.json", [])) / 60


def _closing(fam: list, out: str) -> list[str]:
  L = [
    "## Closing note\n",
    f"Wall time of the runs: {wall_minutes(out):.0f} min over "
    f"{len(_read(out, 'invocations.json', []))} invocation(s) of `make reproduce-long` "
    f"(training and evaluation, niced beside other work). Headline numbers, the primary "
    f"family (95 % bootstrap intervals; P1 also its 90 % t-interval), after Holm over "
    f"{primary.family_size(fam)} rows:\n",
  ]
  for r in fam:
    L.append(
      f"- ({r['id']}) {r['test']}: {r['figure']}; t p = "
      f"{lr._pval((r.get('t') or {}).get('p'))}, sign-flip p = "
      f"{lr._pval((r.get('sign_flip') or {}).get('p'))}; {r['verdict']}, after Holm "
      f"{r['verdict_holm']} (Holm p = {lr._pval(r.get('p_holm'))})"
    )
  return L + [""]
