"""results/README.md for `make reproduce`: the paper's tables with 95 % intervals over seeds and
evaluation units, per-run rows (every run made), loss curves, the retrieval study, and a
claim-by-claim table against the paper, all computed from the numbers (never written by hand).

write(out_dir, report, runs, curves, meta, recall=None) is called by reproduce.py; `report` is
the schema-v2 report.json of `rove-eval --compare` over all runs, `recall` the retrieval
study's records (rove_jax.evaluation.recall.evaluate's). The intervals and comparisons come
from study.stats (stats.mean_interval / stats.paired_difference); the retrieval-study
section, the claims table and the closing note from study.claims.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Optional, Sequence

from rove_jax.evaluation.plots import ENCODING_NAMES
from rove_jax.evaluation.report import train_len
from rove_jax.evaluation.report_files import replace_files
from study import (
  checks,
  claims_table,
  fmt,
  limits,
  plots,
  position_tasks,
  primary,
  run_info,
  sweep,
  verdicts,
)
from study import claims as claims_lib
from study import numbers as rs

RECALL_PNG = "retrieval_study.png"
POSITION_PNG = "position_retrieval.png"


def _lengths(report, setting="none") -> list[int]:
  out = set()
  for run in report["runs"]:
    rows = (run.get("perplexity") or {}).get(setting) or {}
    out |= {int(k) for k in rows if k.isdigit()}
  return sorted(out)


def _train_len(report: dict):
  """The runs' training length; refuses runs trained at different lengths."""
  found = {train_len(r) for r in report["runs"]}
  if len(found) > 1:
    raise ValueError(
      f"the runs were trained at different lengths {sorted(found)}; the write-up "
      f"compares matched runs only"
    )
  return found.pop() if found else None


def _js(x) -> Optional[dict]:
  """An Interval or Comparison as JSON numbers."""
  if x is None:
    return None
  return {"estimate": x.estimate, "lower": x.lower, "upper": x.upper}


def _cmp_cell(c, claim="lower") -> str:
  return "-" if c is None else f"{fmt.fmt_change(c)} {rs.verdict(c, claim)}"


# -------------------------------------------------------------------------------- sections


def _unit_counts(st: rs.Study) -> str:
  parts = []
  ppl = {L: st.ppl_units(st.order[0], "none", L) for L in _lengths(st.report)}
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


def _method(st: rs.Study) -> list:
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


def _table1(st: rs.Study, base, summary) -> list:
  tasks = st.icl_tasks()
  L = [
    "## Table 1: inside the training context\n",
    f"Held-out loss and perplexity at the training length ({base} tokens), no YaRN; the "
    f"synthetic ICL tasks ({', '.join(tasks) or 'none'}) scored inside the training "
    f"context: exact matches as counts (correct/prompts, summed over seeds) and the mean "
    f"answer NLL over all their prompts.\n",
    "| encoding | seeds | loss (nats/token) | perplexity | ICL correct | ICL answer NLL |",
    "|---|---|---|---|---|---|",
  ]
  for enc in st.order:
    loss, ppl = st.loss(enc, "none", base), st.ppl(enc, "none", base)
    nll, right = st.icl_nll(enc, tasks), st.icl_count(enc, tasks)
    summary["encodings"].setdefault(enc, {})["table1"] = {
      "loss": _js(loss),
      "ppl": _js(ppl),
      "icl_nll": _js(nll),
      "icl_correct": right,
    }
    L.append(
      f"| {fmt.name(enc)} | {len(st.groups[enc])} | {fmt.fmt_interval(loss, 4)} | "
      f"{fmt.fmt_interval(ppl)} | {fmt.fmt_count(right)} | {fmt.fmt_interval(nll)} |"
    )
  for a, b in st.pairs():
    counts = [st.icl_count(a, tasks), st.icl_count(b, tasks)]
    chance = verdicts.study_icl_chance(st, tasks)
    acc = (
      verdicts.NOT_MEASURABLE
      if rs.at_floor(counts, chance)
      else _cmp_cell(st.icl_cmp(a, b, tasks, 1), "higher")
    )
    L.append(
      f"| {fmt.name(a)} - {fmt.name(b)} | | | {_cmp_cell(st.ppl_cmp(a, b, 'none', base))} | "
      f"{acc} | {_cmp_cell(st.icl_cmp(a, b, tasks, 0))} |"
    )
  L.append(
    "\nDifference rows: perplexity as the relative difference (RoVE / other - 1), ICL "
    "accuracy and answer NLL as plain differences, each with its verdict on the "
    "paper's direction (RoVE lower perplexity and NLL, higher accuracy).\n"
  )
  return L


def _perplexity(st: rs.Study, base, summary) -> list:
  lengths = _lengths(st.report)
  protocols = [(r.get("perplexity") or {}).get("protocol") or {} for r in st.report["runs"]]
  fixed = next((p.get("yarn_fixed_factor") for p in protocols if p.get("yarn_fixed_factor")), None)
  L = [
    "## Perplexity by evaluation length\n",
    "Settings: **no YaRN** (the model as trained); **YaRN, factor L/T** (YaRN at inference "
    "with factor L / T at each length L > T; at L <= T it is the model as trained, so those "
    "cells repeat the no-YaRN ones)",
  ]
  if fixed:
    L[-1] += (
      f"; **YaRN, fixed s** (one factor s = {fixed:g} = longest length / T, at every "
      f"length, the shorter ones included: what a model deployed with one setting "
      f"would use)"
    )
  L[-1] += (
    ". NoPE has no rotary frequencies to scale: no YaRN only. Cells: perplexity "
    "(exp of the token-weighted loss) with its interval.\n"
  )
  L.append(
    "| encoding | setting | " + " | ".join(f"{n} ({fmt.mult(n, base)})" for n in lengths) + " |"
  )
  L.append("|---|---|" + "---|" * len(lengths))
  for enc in st.order:
    for setting in fmt.SETTING_NAMES:
      cells = [st.ppl(enc, setting, n) for n in lengths]
      if all(c is None for c in cells):
        continue
      summary["encodings"].setdefault(enc, {}).setdefault("ppl", {})[setting] = {
        str(n): _js(c) for n, c in zip(lengths, cells)
      }
      L.append(
        f"| {fmt.name(enc)} | {fmt.SETTING_NAMES[setting]} | "
        + " | ".join(fmt.fmt_interval(c) for c in cells)
        + " |"
      )
  if st.pairs():
    L.append(
      "\nRelative perplexity difference (RoVE / other - 1; below 0: RoVE lower) and "
      'its verdict on "RoVE is lower":\n'
    )
    L.append(
      "| comparison | setting | " + " | ".join(f"{n} ({fmt.mult(n, base)})" for n in lengths) + " |"
    )
    L.append("|---|---|" + "---|" * len(lengths))
    for a, b in st.pairs():
      for setting in fmt.SETTING_NAMES:
        cells = [st.ppl_cmp(a, b, setting, n) for n in lengths]
        if all(c is None for c in cells):
          continue
        L.append(
          f"| {fmt.name(a)} - {fmt.name(b)} | {fmt.SETTING_NAMES[setting]} | "
          + " | ".join(_cmp_cell(c) for c in cells)
          + " |"
        )
  L.append("\n![perplexity vs length](eval/perplexity_vs_length.png)\n")
  return L


def _skipped(st: rs.Study) -> list:
  """Bullets naming the RULER tasks skipped at some lengths or entirely, with the reason."""
  by_task: dict = {}
  for run in st.report["runs"]:
    for key, why in ((run.get("ruler") or {}).get("skipped") or {}).items():
      task, _, length = key.partition("@")
      by_task.setdefault(task, {}).setdefault(length, why)
  out = []
  for task, where in sorted(by_task.items()):
    if "" in where:
      out.append(f"- {task}: not scored ({where['']})")
    else:
      lens = sorted(int(L) for L in where)
      out.append(f"- {task}: skipped at {', '.join(map(str, lens))} tokens ({where[str(lens[0])]})")
  return out


def _ruler(st: rs.Study, base, summary) -> list:
  L = []
  for setting in ("none", "yarn"):
    lengths, encs = st.ruler_lengths(setting), st.ruler_encodings(setting)
    if not lengths:
      continue
    if not L:
      proto = next(
        (
          (r.get("ruler") or {}).get("protocol")
          for r in st.report["runs"]
          if (r.get("ruler") or {}).get("protocol")
        ),
        {},
      )
      all_lengths = sorted({n for ls in lengths.values() for n in ls})
      L += [
        "## RULER: answer NLL by task (lower is better)\n",
        f"{proto.get('samples', '?')} samples a task and length (seed "
        f"{proto.get('seed', '?')}), the same samples for every run and setting; lengths "
        f"{', '.join(f'{n} ({fmt.mult(n, base)})' for n in all_lengths)}. Answer NLL: the mean "
        f"NLL of the gold answer's tokens (the paper scores RULER by NLL). Exact match "
        f"(greedy) as counts, summed over lengths and seeds. A task's figure is the mean "
        f"over the lengths where that task was scored; the mean over tasks is over the "
        f"tasks in the table.\n",
      ]
      skipped = _skipped(st)
      L.append(
        ("Tasks not scored at every length or at all:\n\n" + "\n".join(skipped) + "\n")
        if skipped
        else "Every task was scored at every length.\n"
      )
    L.append(f"### RULER, {fmt.SETTING_NAMES[setting]}\n")
    if setting == "yarn":
      L.append(
        "YaRN with factor L / T at each length. NoPE has no rotary frequencies: no YaRN row.\n"
      )
    pairs = st.pairs(encs)
    head = (
      ["task", "lengths"]
      + [fmt.name(e) for e in encs]
      + [f"{fmt.name(a)} - {fmt.name(b)}" for a, b in pairs]
      + ["exact match (" + " / ".join(fmt.name(e) for e in encs) + ")"]
    )
    L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out = summary["ruler"].setdefault(setting, {})
    for task in list(lengths) + ["mean"]:
      lens = "each task's" if task == "mean" else ", ".join(map(str, lengths[task]))
      cells = [st.ruler_nll(e, setting, task) for e in encs]
      cmps = [st.ruler_cmp(a, b, setting, task) for a, b in pairs]
      counts = [fmt.fmt_count(st.ruler_count(e, setting, task)) for e in encs]
      out[task] = {
        "lengths": lengths.get(task),
        "nll": {e: _js(c) for e, c in zip(encs, cells)},
        "comparisons": {f"{a}-{b}": _js(c) for (a, b), c in zip(pairs, cmps)},
      }
      label = "**mean over tasks**" if task == "mean" else task
      row = (
        [label, lens]
        + [fmt.fmt_interval(c) for c in cells]
        + [_cmp_cell(c) for c in cmps]
        + [" / ".join(counts)]
      )
      L.append("| " + " | ".join(row) + " |")
    L.append("")
  if L:
    L.append("![RULER NLL](eval/ruler_nll.png)\n")
  return L


def _icl(st: rs.Study, summary) -> list:
  tasks = st.icl_tasks()
  if not tasks:
    return []
  proto = next(
    (
      (r.get("icl") or {}).get("protocol")
      for r in st.report["runs"]
      if (r.get("icl") or {}).get("protocol")
    ),
    {},
  )
  L = ["## In-context learning inside the training context\n"]
  if proto.get("rule"):
    L.append(
      f'Rule (the report\'s protocol): "{proto["rule"]}". By-length tasks at '
      f"{', '.join(map(str, proto.get('lengths', [])))} tokens, few-shot tasks at "
      f"{', '.join(map(str, proto.get('shots', [])))} shots, {proto.get('samples')} "
      f"samples each (seed {proto.get('seed')}).\n"
    )
  cut = {
    e: [
      ((r["icl"]["synthetic"].get("truncated")), r["icl"]["synthetic"].get("prompts"))
      for r in st.icl_runs(e)
    ]
    for e in st.order
  }
  L.append(
    "Prompts cut from the left to fit: "
    + "; ".join(
      f"{fmt.name(e)} {sum(c[0] or 0 for c in v)} of {sum(c[1] or 0 for c in v)}"
      for e, v in cut.items()
    )
    + ". Accuracy is greedy exact match, given as counts "
    "(correct/prompts over seeds); the answer NLL is the mean over the task's prompts.\n"
  )
  pairs = st.pairs()
  head = (
    ["task"]
    + [f"{fmt.name(e)} correct" for e in st.order]
    + [f"{fmt.name(e)} answer NLL" for e in st.order]
    + [f"{fmt.name(a)} - {fmt.name(b)} NLL" for a, b in pairs]
    + [f"{fmt.name(a)} - {fmt.name(b)} accuracy" for a, b in pairs]
  )
  L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for task in tasks + ["all"]:
    sel = tasks if task == "all" else [task]
    counts = {e: st.icl_count(e, sel) for e in st.order}
    accs = []
    for a, b in pairs:
      floor = rs.at_floor([counts[a], counts[b]], verdicts.study_icl_chance(st, sel))
      accs.append(
        verdicts.NOT_MEASURABLE if floor else _cmp_cell(st.icl_cmp(a, b, sel, 1), "higher")
      )
    summary["icl"][task] = {
      "correct": counts,
      "nll": {e: _js(st.icl_nll(e, sel)) for e in st.order},
    }
    cells = (
      [f"{'**all tasks**' if task == 'all' else task}"]
      + [fmt.fmt_count(counts[e]) for e in st.order]
      + [fmt.fmt_interval(st.icl_nll(e, sel)) for e in st.order]
      + [_cmp_cell(st.icl_cmp(a, b, sel, 0)) for a, b in pairs]
      + accs
    )
    L.append("| " + " | ".join(cells) + " |")
  L.append("")
  return L


def build(
  report: dict,
  runs: list[dict],
  curves: dict,
  meta: dict,
  recall: Optional[Sequence[dict]] = None,
  *,
  n_boot: int = rs.N_BOOT,
  ppl_report: Optional[dict] = None,
  positions: Optional[dict] = None,
  recall_chance: float = 0.0,
):
  """(markdown, summary dict, {PNG name: bytes or None}) for results/. `runs` are
  reproduce.plan's (the checks' runs, kind "long" and "lr", go to their own section; the main
  ones are the report's), `ppl_report` the perplexity-only report of the added seeds and the
  training-length check, `positions` {task: recall.json content} of the position-dependent
  retrieval tasks, `recall_chance` the chance accuracy of the retrieval study's task
  (study.verdicts.recall_chance)."""
  st = rs.Study(report, recall, rs.Boot(n_boot), recall_chance)
  main = [r for r in runs if r.get("kind", "main") == "main"]
  base = _train_len(report)
  summary = {"encodings": {}, "ruler": {}, "icl": {}, "claims": []}
  L = run_info.header(st, meta) + sweep.section(meta.get("lr_sweep")) + _method(st)
  L += _table1(st, base, summary)
  L += _perplexity(st, base, summary) + _ruler(st, base, summary) + _icl(st, summary)
  recall_md, png, summary["retrieval"] = claims_lib.retrieval(st, RECALL_PNG)
  L += recall_md
  pos_md, pos_png, summary["position_tasks"] = position_tasks.section(
    positions or {}, st.boot, POSITION_PNG
  )
  L += pos_md
  rows = claims_lib.rows(st, base, position_tasks.claim_rows(positions or {}, st.boot))
  summary["claims"] = rows
  L += claims_table.table(rows, primary.left_note(st))
  check_md, summary["checks"] = checks.section(runs, curves, [report, ppl_report], meta, base)
  L += check_md
  L += limits.paragraph(report, main, curves, meta, base)
  L += run_info.every_run([report, ppl_report], runs, curves, meta)
  L += claims_table.closing(st, base, rows, meta)
  return "\n".join(L), summary, {RECALL_PNG: png, POSITION_PNG: pos_png}


def write(
  out_dir: str,
  report: dict,
  runs: list[dict],
  curves: dict,
  meta: dict,
  recall: Optional[Sequence[dict]] = None,
  *,
  n_boot: int = rs.N_BOOT,
  ppl_report: Optional[dict] = None,
  positions: Optional[dict] = None,
  recall_chance: float = 0.0,
) -> dict:
  """Writes README.md, summary.json, loss_curves.png and (with `recall` records)
  retrieval_study.png to out_dir, all or none of them (report_files.replace_files); a PNG the
  README does not link is removed. Returns the summary."""
  os.makedirs(out_dir, exist_ok=True)
  text, summary, figures = build(
    report,
    runs,
    curves,
    meta,
    recall,
    n_boot=n_boot,
    ppl_report=ppl_report,
    positions=positions,
    recall_chance=recall_chance,
  )
  files = {
    os.path.join(out_dir, "README.md"): text,
    os.path.join(out_dir, "summary.json"): json.dumps({"meta": meta, **summary}, indent=2),
  }
  main = [r for r in runs if r.get("kind", "main") == "main"]
  pngs = {"loss_curves.png": plots.loss_curves(curves, main, ENCODING_NAMES), **figures}
  for file, data in pngs.items():
    if data is not None:
      files[os.path.join(out_dir, file)] = data
  replace_files(files)
  for file, data in pngs.items():
    if data is None:  # README.md does not link it: no stale plot of an earlier write
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out_dir, file))
  return summary
