"""results/README.md, second part (study.writeup draws the rest): the retrieval study's
section, the claim-by-claim table against the paper, and the closing note.

The claims are those of the paper's abstract and Section 4 (arXiv 2606.11275),
each attributed to where the paper makes it; nothing else is attributed to the
paper. Every verdict comes from the seed-level tests (study.verdicts: the paired t-test over
seed pairs, the exact sign-flip test beside it), every interval from the bootstrap
(study.stats); accuracies within the margin of chance get counts instead of a verdict.
"""

from __future__ import annotations

from typing import Optional, Sequence

from study import fmt, plots, primary, verdicts
from study import numbers as rs
from study.fmt import SETTING_NAMES as SETTINGS
from study.fmt import mult as _x
from study.fmt import name as _name

CLAIMS = {
  "a": 'RoVE improves few-shot in-context learning (abstract; Sec. 4 "RoVE improves in the '
  'trained regime": Core ICL accuracy, measured inside the training context)',
  "b": 'RoVE improves in-context perplexity (Sec. 4 "RoVE improves in the trained regime")',
  "c": "RoVE improves out-of-distribution perplexity (abstract; Sec. 4: perplexity up to 16x "
  "the training context, with and without YaRN)",
  "d1": 'YaRN improves both baselines (Sec. 4 "RoVE and YaRN are complementary")',
  "d2": '... while largely preserving the gap between them (Sec. 4 "RoVE and YaRN are '
  'complementary")',
  "e": 'RoVE improves long-context retrieval (abstract; Sec. 4 "RoVE improves long-context '
  'retrieval": RULER, scored by NLL)',
  "f": "the improvements are largest on tasks requiring long-sequence aggregation (abstract; "
  'Sec. 4 "RoVE improves long-context retrieval")',
}


def _pct(iv) -> str:
  """A within-run relative change (an Interval) in percent."""
  if iv is None:
    return "-"
  return (
    f"{100 * iv.estimate:+.1f} % [{100 * iv.lower:+.1f}, {100 * iv.upper:+.1f}]"
    + fmt.seeds_note(iv)
  )


def _row(cid, test, figure, verdict, claim=None, result=None, **extra) -> dict:
  return primary.row(cid, claim or CLAIMS[cid], test, figure, verdict, result, **extra)


def _both(verdicts) -> str:
  """Both encodings' verdicts on one claim: supports only if both do."""
  if "contradicts" in verdicts:
    return "contradicts"
  return "supports" if all(v == "supports" for v in verdicts) else "inconclusive"


def _ppl_lengths(st: rs.Study) -> list:
  return sorted(
    {
      int(L)
      for r in st.report["runs"]
      for L in ((r.get("perplexity") or {}).get("none") or {})
      if L.isdigit()
    }
  )


def recall_train_len(records) -> Optional[int]:
  """The study's training length: from a record's `multiple` (length / T), else the shortest
  evaluated length."""
  for rec in records:
    if rec.get("multiple"):
      return int(round(rec["length"] / rec["multiple"]))
  return min((int(r["length"]) for r in records), default=None)


# ----------------------------------------------------------------------- retrieval study


def _recall_layout(st: rs.Study):
  encs = [e for e in rs.ORDER if any(r["encoding"] == e for r in st.recall)]
  encs += sorted({r["encoding"] for r in st.recall} - set(encs))
  settings = [s for s in SETTINGS if any(r["setting"] == s for r in st.recall)]
  lengths = sorted({int(r["length"]) for r in st.recall})
  return encs, settings, lengths


def retrieval(
  st: rs.Study,
  png_name: str,
  heading: str = "## Retrieval study",
  task: str = "synthetic associative recall",
):
  """(markdown lines, PNG bytes or None, summary dict or None) of a retrieval study (its
  records in st.recall): `heading`, then tables by length for models trained on `task`."""
  if not st.recall:
    return [], None, None
  encs, settings, lengths = _recall_layout(st)
  T = recall_train_len(st.recall)
  n = sorted({len(r.get("sample_nll") or ()) for r in st.recall})
  seeds = "; ".join(
    f"{_name(e)} {len({r['seed'] for r in st.recall if r['encoding'] == e})}" for e in encs
  )
  L = [
    f"{heading}\n",
    f"Small models trained on {task} at T = {T} tokens "
    f"(rove_jax/evaluation/recall.py), seeds: {seeds}; {'/'.join(map(str, n))} test samples "
    f"a length, the same samples for every model, so comparisons are paired. Accuracy: "
    f"greedy exact match of the one-token answer; answer NLL in nats. Settings as for "
    f"perplexity (YaRN factor L/T; fixed s = longest / T at every length). This study is "
    f"not in the paper.\n",
  ]
  head = "| encoding | setting | " + " | ".join(f"{x} ({_x(x, T)})" for x in lengths) + " |"
  rule = "|---|---|" + "---|" * len(lengths)
  summary = {"train_len": T, "cells": {}}
  for key, title in (("sample_correct", "Accuracy"), ("sample_nll", "Answer NLL")):
    L += [f"{title}:\n", head, rule]
    for e in encs:
      for s in settings:
        cells = [st.recall_cell(e, s, [x], key) for x in lengths]
        if all(c is None for c in cells):
          continue
        summary["cells"].setdefault(key, {}).setdefault(e, {})[s] = {
          str(x): None if c is None else [c.estimate, c.lower, c.upper]
          for x, c in zip(lengths, cells)
        }
        L.append(
          f"| {_name(e)} | {SETTINGS[s]} | " + " | ".join(fmt.fmt_interval(c) for c in cells) + " |"
        )
    L.append("")
  for key, title, claim in (
    ("sample_correct", "accuracy", "higher"),
    ("sample_nll", "answer NLL", "lower"),
  ):
    L += [
      f'RoVE minus the other encoding, {title} (verdict on "RoVE is {claim}"):\n',
      head.replace("| encoding |", "| comparison |"),
      rule,
    ]
    for a, b in st.pairs(encs):
      for s in settings:
        cells = [st.recall_cmp(a, b, s, [x], key) for x in lengths]
        if all(c is None for c in cells):
          continue
        L.append(
          f"| {_name(a)} - {_name(b)} | {SETTINGS[s]} | "
          + " | ".join(
            "-"
            if c is None
            else f"{fmt.fmt_change(c)} "
            + (
              "at the ceiling"
              if rs.at_ceiling(_counts(st, a, b, s, [x]))
              else verdicts.NOT_MEASURABLE
              if rs.at_floor(_counts(st, a, b, s, [x]), st.recall_chance)
              else rs.verdict(c, claim)
            )
            for x, c in zip(lengths, cells)
          )
          + " |"
        )
    L.append("")
  png = plots.retrieval_study(
    st.recall,
    train_lengths=[T] if T else [],
    title=f"{heading.lstrip('# ')}: accuracy and answer NLL vs length",
  )
  if png is not None:
    L.append(f"![retrieval study]({png_name})\n")
  L.append(_recall_paragraph(st, encs, settings, lengths, T) + "\n")
  return L, png, summary


def _counts(st, a, b, s, xs) -> list:
  """Both encodings' retrieval (correct, queries) at lengths xs, for at_floor / at_ceiling."""
  return [rs.count(st.recall_units(e, s, xs, "sample_correct")) for e in (a, b)]


def _recall_paragraph(st, encs, settings, lengths, T) -> str:
  """What the study shows, from its numbers."""
  acc = lambda e, s, x: st.recall_cell(e, s, [x], "sample_correct")  # noqa: E731
  text = "What it shows (computed from the tables above): "
  if T in lengths and "none" in settings:
    text += (
      f"at the training length ({T} tokens) accuracy is "
      + ", ".join(
        f"{_name(e)} {fmt.fmt_interval(acc(e, 'none', T))}"
        for e in encs
        if acc(e, "none", T) is not None
      )
      + ". "
    )
  if ("rove", "rope") not in st.pairs(encs):
    return text + "No RoVE-RoPE comparison (both are needed)."
  parts = []
  for key, what, claim in (
    ("sample_correct", "accuracy", "higher"),
    ("sample_nll", "answer NLL", "lower"),
  ):
    tally = {
      "supports": 0,
      "contradicts": 0,
      "inconclusive": 0,
      "floor": 0,
      "ceiling": 0,
      verdicts.FEW_PAIRS: 0,
    }
    for s in settings:
      for x in (x for x in lengths if T is None or x > T):
        c = st.recall_cmp("rove", "rope", s, [x], key)
        if c is None:
          continue
        counts = _counts(st, "rove", "rope", s, [x])
        if rs.at_floor(counts, st.recall_chance):
          tally["floor"] += 1
        elif rs.at_ceiling(counts):
          tally["ceiling"] += 1
        else:
          tally[rs.verdict(c, claim)] += 1
    other = "lower" if claim == "higher" else "higher"
    parts.append(
      f"RoVE's {what} is {claim} than RoPE's (paired t over seed pairs, p < "
      f"{verdicts.ALPHA:g}) in {tally['supports']}, {other} in "
      f"{tally['contradicts']}, and neither in {tally['inconclusive']}"
      + (
        f", with fewer than {verdicts.MIN_PAIRS} seed pairs (no test) in "
        f"{tally[verdicts.FEW_PAIRS]}"
        if tally[verdicts.FEW_PAIRS]
        else ""
      )
      + (
        f", both within {verdicts.MARGIN:g} of chance ({st.recall_chance:.3g}: "
        f"not measurable) in {tally['floor']}"
        if tally["floor"]
        else ""
      )
      + (f", both at the ceiling (no verdict) in {tally['ceiling']}" if tally["ceiling"] else "")
    )
    cells = sum(tally.values())
  text += (
    f"Of the {cells} length-setting cells past the training length, " + "; ".join(parts) + ". "
  )
  x = lengths[-1]
  text += (
    f"At the longest length ({x} tokens, {_x(x, T)}), accuracy RoVE vs RoPE: "
    + "; ".join(
      f"{SETTINGS[s]} {fmt.fmt_interval(acc('rove', s, x))} vs "
      f"{fmt.fmt_interval(acc('rope', s, x))}"
      for s in settings
    )
    + "."
  )
  return text


# ---------------------------------------------------------------------------------- claims


def rows(st: rs.Study, base, extra: Sequence[dict] = ()) -> list:
  """Every claim row, RoVE vs RoPE ([] without both): the primary family (study/primary.py),
  then the exploratory rows (with `extra`, rows of other studies such as the position tasks'
  `recall_rows`), then YaRN against no YaRN (about YaRN, not RoVE: "d1"), each family with
  Holm-adjusted verdicts over its own tested rows."""
  if not {"rove", "rope"} <= set(st.groups):
    return []
  lengths = _ppl_lengths(st)
  longer = [x for x in lengths if x > base]
  explore = primary.former(st, base) + _icl_rows(st, base)
  for s in SETTINGS:
    for x in longer:
      c = st.ppl_cmp("rove", "rope", s, x)
      if c is not None and not _duplicate(s, x, longer):
        explore.append(
          _row(
            "c",
            f"perplexity at {x} tokens ({_x(x, base)}), {SETTINGS[s]}: RoVE / RoPE - 1",
            fmt.fmt_change(c),
            rs.verdict(c),
            result=c,
          )
        )
  explore += _gap_rows(st, base, longer)
  explore += _ruler_rows(st, base)
  explore += recall_rows(st) + [dict(r) for r in extra]
  for r in explore:
    r["family"] = "exploratory"
  yarn = _yarn_rows(st, base, longer)
  return primary.rows(st, base, lengths) + primary.adjust(explore) + primary.adjust(yarn)


def _duplicate(setting, x, longer) -> bool:
  """The fixed YaRN factor is longest / T: at the longest length it is the factor L / T, and
  its row would repeat the L / T row."""
  return setting == "yarn_fixed" and bool(longer) and x == longer[-1]


def _icl_rows(st, base) -> list:
  """ICL answer NLL, pooled and per task (the pooled accuracy is primary)."""
  tasks = st.icl_tasks()
  if not tasks:
    return []
  c = st.icl_cmp("rove", "rope", tasks, 0)
  counts = [st.icl_count(e, tasks) for e in ("rove", "rope")]
  out = [
    _row(
      "a",
      f"synthetic ICL, {len(tasks)} tasks pooled, inside the {base}-token "
      f"training context: answer NLL (mean, nats), RoVE - RoPE",
      fmt.fmt_change(c),
      primary.measured(counts, verdicts.study_icl_chance(st, tasks), rs.verdict(c)),
      result=c,
    )
  ]
  for task in tasks:
    c = st.icl_cmp("rove", "rope", [task], 0)
    counts = [st.icl_count(e, [task]) for e in ("rove", "rope")]
    out.append(
      _row(
        "a",
        f"synthetic ICL task {task}: answer NLL, RoVE - RoPE",
        f"{fmt.fmt_change(c)} (exact match RoVE {fmt.fmt_count(counts[0])}, "
        f"RoPE {fmt.fmt_count(counts[1])})",
        primary.measured(counts, verdicts.study_icl_chance(st, [task]), rs.verdict(c)),
        result=c,
      )
    )
  return out


def _yarn_rows(st, base, longer) -> list:
  """d1: YaRN at factor L / T against no YaRN, within the same runs, for each encoding (the
  paper's claim is about YaRN; these rows do not count for or against RoVE). Each encoding's
  verdict: the one-sample t-test over its runs of the within-run change of the loss."""
  out = []
  for x in longer:
    ch = {e: st.yarn_change(e, "yarn", x) for e in ("rove", "rope")}
    if None in ch.values():
      continue
    diffs = {e: _run_changes(st, e, x) for e in ch}
    verdicts_ = [verdicts.from_diffs(diffs[e]) for e in ch]
    tests = {e: primary.p_cell(verdicts.seed_tests(diffs[e])) for e in ch}
    out.append(
      _row(
        "d1",
        f"{SETTINGS['yarn']} vs no YaRN at {x} tokens ({_x(x, base)}), same "
        f"runs: perplexity ratio - 1 for each encoding",
        f"RoVE {_pct(ch['rove'])}, {tests['rove']}; RoPE {_pct(ch['rope'])}, {tests['rope']}",
        _both(verdicts_),
        family="yarn",
      )
    )
  return out


def _run_changes(st, enc, x) -> list:
  """Each run's loss with YaRN (factor L / T) minus without at length x (nats per token)."""
  units = st._ppl_mix(enc, "yarn", x, 1.0)
  return [float(s.sum() / w.sum()) for s, w in zip(units.scores, units.weights)]


def _gap_rows(st, base, longer) -> list:
  """d2: is the RoVE-RoPE gap with YaRN at least half the gap without?"""
  out = []
  for s in ("yarn", "yarn_fixed"):
    for x in longer:
      without, with_, kept = (
        st.ppl_cmp("rove", "rope", "none", x),
        st.ppl_cmp("rove", "rope", s, x),
        st.gap_kept(s, x),
      )
      if None in (without, with_, kept) or _duplicate(s, x, longer):
        continue
      verdict = rs.verdict(kept)
      if rs.verdict(without) != "supports":
        verdict = "inconclusive: no RoVE-RoPE gap without YaRN to preserve"
      out.append(
        _row(
          "d2",
          f"at {x} tokens ({_x(x, base)}), {SETTINGS[s]}: is the RoVE-RoPE log-perplexity "
          f'gap with YaRN at least half the gap without ("largely" read so here)? '
          f"Figure: gap with - 0.5 x gap without, below 0 supports",
          f"gap without {fmt.fmt_change(without)}, with {fmt.fmt_change(with_)}; test "
          f"{fmt.fmt_change(kept, 3)} nats",
          verdict,
          result=kept,
        )
      )
  return out


def _ruler_rows(st, base) -> list:
  """RULER per task, with and without YaRN (the mean and the aggregation contrast are
  primary)."""
  out = []
  for s in ("none", "yarn"):
    lengths = st.ruler_lengths(s)
    if "rove" not in st.ruler_encodings(s) or "rope" not in st.ruler_encodings(s):
      continue
    for task in lengths:
      c = st.ruler_cmp("rove", "rope", s, task)
      counts = [st.ruler_count(e, s, task) for e in ("rove", "rope")]
      em = f"exact match RoVE {fmt.fmt_count(counts[0])}, RoPE {fmt.fmt_count(counts[1])}"
      test = (
        f"RULER {task} answer NLL, mean over {', '.join(map(str, lengths[task]))} "
        f"tokens, {SETTINGS[s]}: RoVE - RoPE"
      )
      claim = f"{CLAIMS['e'].split(' (')[0]} (abstract; Sec. 4): RULER task {task}"
      if task in rs.AGGREGATION:
        claim += " (an aggregation task in RULER's own categories: bears on (f))"
      out.append(
        _row(
          "e",
          test,
          f"{fmt.fmt_change(c)} nats; {em}",
          primary.measured(counts, 0.0, rs.verdict(c)),
          claim,
          result=c,
        )
      )
  return out


def recall_rows(st, label: str = "retrieval study (not in the paper)") -> list:
  """A retrieval study's rows (st.recall: its records), RoVE - RoPE past T in each setting:
  accuracy (no verdict at chance or at the ceiling) and answer NLL; `label` starts each test."""
  if not st.recall:
    return []
  encs, settings, lengths = _recall_layout(st)
  T = recall_train_len(st.recall)
  longer = [x for x in lengths if T is None or x > T]
  if ("rove", "rope") not in st.pairs(encs) or not longer:
    return []
  out, where = [], ", ".join(map(str, longer))
  claim = "RoVE improves long-context retrieval (abstract; Sec. 4)"
  for s in settings:
    counts = [rs.count(st.recall_units(e, s, longer, "sample_correct")) for e in ("rove", "rope")]
    c = st.recall_cmp("rove", "rope", s, longer, "sample_correct")
    test = f"{label}, {SETTINGS[s]}: accuracy, mean over {where} tokens (past T = {T}), RoVE - RoPE"
    shown = f"RoVE {fmt.fmt_count(counts[0])}, RoPE {fmt.fmt_count(counts[1])} correct"
    if c is None:
      continue
    ceiling = rs.at_ceiling(counts)
    floor = verdicts.measurable_note(counts, st.recall_chance, ("RoVE", "RoPE"))
    if floor:
      out.append(
        _row("e", test, f"{fmt.fmt_change(c, 3)} ({shown})", floor, claim, result=c, recall=s)
      )
    else:
      out.append(
        _row(
          "e",
          test,
          f"{fmt.fmt_change(c, 3)} ({shown})",
          f"at the ceiling: {shown}" if ceiling else rs.verdict(c, "higher"),
          claim,
          result=c,
          recall=s,
        )
      )
    c = st.recall_cmp("rove", "rope", s, longer, "sample_nll")
    out.append(
      _row(
        "e",
        f"{label}, {SETTINGS[s]}: answer NLL, mean over {where} tokens, RoVE - RoPE",
        fmt.fmt_change(c) + " nats",
        "at the ceiling: every answer right, no verdict" if ceiling else floor or rs.verdict(c),
        claim,
        result=c,
      )
    )
  return out
