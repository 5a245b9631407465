"""report.md: the tables of a report.json (report.py's schema, version 2; version-1 reports
render too) in the paper's layout.

  Perplexity: rows = runs x YaRN settings (-, +YaRN, +YaRN fixed s=...), columns = lengths.
  RULER: per setting (no YaRN, +YaRN), one table per length (cells "mean answer NLL, exact
    matches / samples") and one of per-task means over the lengths each task was scored at
    (the caption names the tasks scored at fewer lengths).
  ICL: exact matches / samples per synthetic task, the count of prompts cut to the training
    context, and Core with per-task counts for task files.
Exact match and accuracy are floor metrics at this scale: always counts, never relative
percentages.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from rove_jax.evaluation.report import PPL_SETTINGS, RULER_SETTINGS, ruler_settings, train_len


def _fmt(x, digits=2):
  return "-" if x is None else f"{x:.{digits}f}"


def _count(correct, n) -> str:
  return f"{int(correct)}/{int(n)}"


def _row_correct(row: dict) -> int:
  """A cell's exact matches (version-1 rows hold only the fraction)."""
  return int(row["correct"]) if "correct" in row else round(row["exact_match"] * row["n"])


def markdown(report: dict, plots: Optional[list] = None) -> str:
  """The report's tables as Markdown; `plots` (file names) are listed at the end, None leaves
  the list out. Exact match and accuracy are shown as counts (k/n), never as percentages."""
  runs = report["runs"]
  lines = [f"# Evaluation report ({report['suite']} suite)", ""]
  lines.append("| run | encoding | params | step | train length |")
  lines.append("|---|---|---|---|---|")
  for r in runs:
    m = r["model"]
    lines.append(
      f"| {r['name']} | {m['pos_encoding']} | {m['params'] / 1e6:.1f}M | {r['step']} "
      f"| {train_len(r)} |"
    )
  lines += _perplexity_md([r for r in runs if r.get("perplexity")])
  lines += _ruler_md([r for r in runs if r.get("ruler")])
  lines += _icl_md([r for r in runs if r.get("icl") and r["icl"].get("synthetic")])
  lines += _recall_md([r for r in runs if r.get("recall")])
  if plots is not None:
    lines += ["", "Plots: " + (", ".join(plots) if plots else "none (nothing to plot)")]
  lines.append("")
  return "\n".join(lines)


def _perplexity_md(ppl_runs: list) -> list:
  if not ppl_runs:
    return []
  lengths = sorted(
    {
      int(L)
      for r in ppl_runs
      for s in PPL_SETTINGS
      for L in (r["perplexity"].get(s) or {})
      if L.isdigit()
    }
  )
  proto = ppl_runs[0]["perplexity"]["protocol"]
  T = proto.get("train_len", train_len(ppl_runs[0]))
  fixed = proto.get("yarn_fixed_factor")
  labels = {
    "none": "-",
    "yarn": "+YaRN",
    "yarn_fixed": f"+YaRN fixed s={fixed:g}" if fixed else "+YaRN fixed",
  }
  settings = (
    f'"-": the model as trained; +YaRN: that factor at each length L > {T} (the '
    f"identity at L <= {T})"
  )
  if any("yarn_fixed" in r["perplexity"] for r in ppl_runs):
    settings += (
      f"; +YaRN fixed: one factor s = {fixed:g} at every length, those <= {T} "
      f"included (a deployed model's setting)"
      if fixed
      else "; +YaRN fixed: one factor at every length (not applicable here)"
    )
  lines = [
    "",
    "## Perplexity by evaluation length",
    "",
    f"Protocol: {proto['mode']} windows, up to {proto['max_tokens']} target tokens per "
    f"length on {_scored_text(proto)}; YaRN factor = L / {T} for longer L. Settings: "
    f"{settings}. Rows = runs x settings, columns = lengths (tokens).",
    "",
  ]
  lines.append("| run | YaRN | " + " | ".join(str(L) for L in lengths) + " |")
  lines.append("|---|---|" + "---|" * len(lengths))
  for r in ppl_runs:
    for setting in PPL_SETTINGS:
      rows = r["perplexity"].get(setting)
      if rows is None:
        continue
      if "not_applicable" in rows:
        lines.append(f"| {r['name']} | {labels[setting]} | n/a: {rows['not_applicable']} |")
        continue
      cells = [_fmt(rows.get(str(L), {}).get("ppl")) for L in lengths]
      lines.append(f"| {r['name']} | {labels[setting]} | " + " | ".join(cells) + " |")
  return lines


def _scored_text(proto: dict) -> str:
  """What the perplexity windows were cut from: --data-path's file, or the run's own text."""
  return f"`{proto['text']}`" if proto.get("text") else "the held-out split"


def _ruler_md(ruler_runs: list) -> list:
  if not ruler_runs:
    return []
  proto = ruler_runs[0]["ruler"].get("protocol", {})
  lines = [
    "",
    "## RULER: NLL of the gold answer (lower is better) and greedy exact match",
    "",
    f"Protocol: {proto.get('samples', '?')} samples per (task, length), the same samples "
    f'for every run and setting (seed {proto.get("seed", "?")}). A cell is "mean answer '
    f'NLL, exact matches / samples"; exact match needs every answer token greedy.',
  ]
  titles = {
    "none": "No YaRN (the model as trained)",
    "yarn": "+YaRN (factor L / training length at each length L)",
  }
  for setting in RULER_SETTINGS:
    entries = [(r, ruler_settings(r["ruler"]).get(setting)) for r in ruler_runs]
    entries = [(r, e) for r, e in entries if e is not None]
    if not entries:
      continue
    lines += ["", f"### {titles[setting]}", ""]
    lines += [
      f"- {r['name']}: n/a ({e['not_applicable']})" for r, e in entries if "not_applicable" in e
    ]
    entries = [(r, e["tasks"]) for r, e in entries if "tasks" in e]
    if entries:
      lines += _ruler_tables(entries)
  skipped = {t: why for r in ruler_runs for t, why in r["ruler"].get("skipped", {}).items()}
  if skipped:
    lines.append("")
  for t, why in sorted(skipped.items()):
    lines.append(f"- {t}: skipped ({why})")
  return lines


def _ruler_tables(entries: list) -> list:
  """One table per length and one of per-task means over lengths, for one setting."""
  tasks = sorted({t for _, by_task in entries for t in by_task})
  lengths = sorted({int(L) for _, by_task in entries for t in by_task.values() for L in t})
  lines = []
  for L in lengths:
    lines += [
      f"Length {L} tokens (mean NLL: over the tasks scored at this length; exact "
      f"match: pooled over them):",
      "",
    ]
    lines.append("| run | " + " | ".join(tasks) + " | mean NLL | exact match |")
    lines.append("|---|" + "---|" * (len(tasks) + 2))
    for r, by_task in entries:
      rows = [by_task.get(t, {}).get(str(L)) for t in tasks]
      cells = [
        "-" if row is None else f"{row['nll']:.2f}, {_count(_row_correct(row), row['n'])}"
        for row in rows
      ]
      got = [row for row in rows if row is not None]
      mean = np.mean([row["nll"] for row in got]) if got else None
      total = _count(sum(map(_row_correct, got)), sum(row["n"] for row in got)) if got else "-"
      lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {_fmt(mean)} | {total} |")
    lines.append("")
  # Each task's mean is over the lengths it was scored at; name them where they differ.
  at = {t: sorted({int(L) for _, by_task in entries for L in by_task.get(t, {})}) for t in tasks}
  differ = [f"{t} ({', '.join(map(str, at[t]))} only)" for t in tasks if at[t] != lengths]
  caption = (
    f"Mean over lengths, per task: a task's answer NLL averaged over the lengths it "
    f"was scored at: {', '.join(map(str, lengths))} tokens for every task"
  )
  if differ:
    caption += f" except {'; '.join(differ)}, skipped at the other lengths (see the skipped list)"
  caption += (
    "; exact matches pooled over the same lengths; mean NLL: the mean over the tasks "
    "of these means."
  )
  lines += [caption, ""]
  lines.append("| run | " + " | ".join(tasks) + " | mean NLL |")
  lines.append("|---|" + "---|" * (len(tasks) + 1))
  for r, by_task in entries:
    cells, means = [], []
    for t in tasks:
      rows = list(by_task.get(t, {}).values())
      if not rows:
        cells.append("-")
        continue
      means.append(float(np.mean([row["nll"] for row in rows])))
      right = _count(sum(map(_row_correct, rows)), sum(row["n"] for row in rows))
      cells.append(f"{means[-1]:.2f}, {right}")
    lines.append(
      f"| {r['name']} | " + " | ".join(cells) + f" | {_fmt(np.mean(means) if means else None)} |"
    )
  return lines


def _icl_md(icl_runs: list) -> list:
  if not icl_runs:
    return []
  tasks = sorted({t for r in icl_runs for t in r["icl"]["synthetic"]["tasks"]})
  proto = icl_runs[0]["icl"].get("protocol")
  lines = ["", "## In-context learning (synthetic tasks, greedy exact match)", ""]
  if proto:
    lengths, shots = (", ".join(map(str, proto[k])) for k in ("lengths", "shots"))
    lines.append(
      f"Protocol: {proto['rule']}. By-length tasks at {lengths} tokens, few-shot "
      f"tasks at {shots} shots, {proto['samples']} samples each (seed "
      f"{proto['seed']})."
    )
  lines.append(
    "Cells: exact matches / samples, pooled over a task's lengths or shot counts; "
    '"all": pooled over the tasks; "cut": prompts cut to fit the context.'
  )
  lines += ["", "| run | " + " | ".join(tasks) + " | all | cut |"]
  lines.append("|---|" + "---|" * (len(tasks) + 2))
  for r in icl_runs:
    synth = r["icl"]["synthetic"]
    rows = [synth["tasks"].get(t) for t in tasks]
    cells = [
      "-"
      if row is None
      else _count(row["correct"], row["n"])
      if "n" in row
      else _fmt(row.get("accuracy"))
      for row in rows
    ]
    got = [row for row in rows if row is not None and "n" in row]
    total = (
      _count(sum(row["correct"] for row in got), sum(row["n"] for row in got))
      if got
      else _fmt(synth.get("accuracy"))
    )
    cut = _count(synth["truncated"], synth["prompts"]) if "prompts" in synth else "-"
    lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {total} | {cut} |")
  lines.append("")
  for r in icl_runs:
    for t, why in sorted(r["icl"]["synthetic"].get("skipped", {}).items()):
      lines.append(f"- {r['name']}: {t} skipped ({why})")
  for r in icl_runs:
    files = r["icl"].get("files")
    if not files:
      continue
    lines.append(
      f"\nCore (centered accuracy, task files) for {r['name']}: {_fmt(files.get('core'), 3)}"
    )
    for name, row in sorted(files["tasks"].items()):
      cut = f", {row['truncated']} of {row['prompts']} prompts cut" if "prompts" in row else ""
      lines.append(
        f"- {name}: {_count(round(row['accuracy'] * row['n']), row['n'])} correct "
        f"({row['num_fewshot']}-shot{cut})"
      )
  return lines


def _recall_md(runs: list) -> list:
  """One table: a row per run and setting, a column per length; cells "k/n (NLL x.xx)"."""
  if not runs:
    return []
  protocol = runs[0]["recall"]["protocol"]
  lengths = sorted({r["length"] for run in runs for r in run["recall"]["records"]})
  lines = [
    "",
    "## Synthetic recall: greedy exact match of the answer and its mean NLL",
    "",
    f"The run's own task (`{protocol['task']}`), {protocol['samples']} test samples a "
    f"length, the same for every run; trained at {protocol['train_len']} tokens.",
    "",
    "| run | setting | " + " | ".join(str(L) for L in lengths) + " |",
    "|---|---|" + "---|" * len(lengths),
  ]
  for run in runs:
    by = {}
    for r in run["recall"]["records"]:
      by.setdefault(r["setting"], {})[r["length"]] = r
    for setting, cells in by.items():
      row = [
        f"{_count(sum(c['sample_correct']), c['n'])} ({_fmt(c['nll'])})" if c is not None else "-"
        for c in (cells.get(L) for L in lengths)
      ]
      lines.append(f"| {run['name']} | {setting} | " + " | ".join(row) + " |")
  return lines
