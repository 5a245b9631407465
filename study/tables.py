"""results/README.md's tables of the paper's measurements, each with 95 % intervals over seeds
and evaluation units: Table 1 (inside the training context: loss, perplexity, ICL), perplexity
by evaluation length under every setting, RULER answer NLL by task, and in-context learning by
task. Each function returns its markdown lines and fills its part of summary.json; the numbers
come from study.numbers.Study, the verdicts of the difference rows from its seed-level tests.
study/writeup.py puts the tables in the README.
"""

from __future__ import annotations

from typing import Optional

from study import fmt, verdicts
from study import numbers as rs


def ppl_lengths(report, setting="none") -> list[int]:
  """The evaluation lengths some run has perplexity at under `setting`, in order."""
  out = set()
  for run in report["runs"]:
    rows = (run.get("perplexity") or {}).get(setting) or {}
    out |= {int(k) for k in rows if k.isdigit()}
  return sorted(out)


def _js(x) -> Optional[dict]:
  """An Interval or Comparison as JSON numbers."""
  if x is None:
    return None
  return {"estimate": x.estimate, "lower": x.lower, "upper": x.upper}


def _cmp_cell(c, claim="lower") -> str:
  return "-" if c is None else f"{fmt.fmt_change(c)} {rs.verdict(c, claim)}"


def table1(st: rs.Study, base, summary) -> list:
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


def perplexity(st: rs.Study, base, summary) -> list:
  lengths = ppl_lengths(st.report)
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


def ruler(st: rs.Study, base, summary) -> list:
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


def icl(st: rs.Study, summary) -> list:
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
