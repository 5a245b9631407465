"""results/README.md, second part (results_writeup draws the rest): the retrieval study's
section, the claim-by-claim table against the paper, and the closing note.

The claims are those of the paper's abstract and Section 4 (2606.11275; the seed text in
shared/seeds), each attributed to where the paper makes it; nothing else is attributed to the
paper. Every verdict comes from an interval (results_stats); accuracies at the floor get counts
instead of a verdict.
"""

from __future__ import annotations

from typing import Optional

from study import numbers as rs
from study import plots
from study.numbers import SETTING_NAMES as SETTINGS
from study.numbers import mult as _x
from study.numbers import name as _name

CLAIMS = {
    "a": "RoVE improves few-shot in-context learning (abstract; Sec. 4 \"RoVE improves in the "
         "trained regime\": Core ICL accuracy, measured inside the training context)",
    "b": "RoVE improves in-context perplexity (Sec. 4 \"RoVE improves in the trained regime\")",
    "c": "RoVE improves out-of-distribution perplexity (abstract; Sec. 4: perplexity up to 16x "
         "the training context, with and without YaRN)",
    "d1": "YaRN improves both baselines (Sec. 4 \"RoVE and YaRN are complementary\")",
    "d2": "... while largely preserving the gap between them (Sec. 4 \"RoVE and YaRN are "
          "complementary\")",
    "e": "RoVE improves long-context retrieval (abstract; Sec. 4 \"RoVE improves long-context "
         "retrieval\": RULER, scored by NLL)",
    "f": "the improvements are largest on tasks requiring long-sequence aggregation (abstract; "
         "Sec. 4 \"RoVE improves long-context retrieval\")",
}


def _pct(iv) -> str:
  """A within-run relative change (an Interval) in percent."""
  if iv is None:
    return "-"
  return (f"{100 * iv.estimate:+.1f} % [{100 * iv.lower:+.1f}, {100 * iv.upper:+.1f}]"
          + rs.seeds_note(iv))


def _row(cid, test, figure, verdict, claim=None, result=None, **extra) -> dict:
  out = {"id": cid, "claim": claim or CLAIMS[cid], "test": test, "figure": figure,
         "verdict": verdict, **extra}
  if result is not None:
    out.update(estimate=result.estimate, lower=result.lower, upper=result.upper)
  return out


def _both(verdicts) -> str:
  """Both encodings' verdicts on one claim: supports only if both do."""
  if "contradicts" in verdicts:
    return "contradicts"
  return "supports" if all(v == "supports" for v in verdicts) else "inconclusive"


def _ppl_lengths(st: rs.Study) -> list:
  return sorted({int(L) for r in st.report["runs"] for L in
                 ((r.get("perplexity") or {}).get("none") or {}) if L.isdigit()})


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


def retrieval(st: rs.Study, png_name: str):
  """(markdown lines, PNG bytes or None, summary dict or None) of the retrieval study."""
  if not st.recall:
    return [], None, None
  encs, settings, lengths = _recall_layout(st)
  T = recall_train_len(st.recall)
  n = sorted({len(r.get("sample_nll") or ()) for r in st.recall})
  seeds = "; ".join(f"{_name(e)} {len({r['seed'] for r in st.recall if r['encoding'] == e})}"
                    for e in encs)
  L = ["## Retrieval study\n",
       f"Small models trained on synthetic associative recall at T = {T} tokens "
       f"(study/retrieval_scoring.py), seeds: {seeds}; {'/'.join(map(str, n))} test samples "
       f"a length, the same samples for every model, so comparisons are paired. Accuracy: "
       f"greedy exact match of the one-token answer; answer NLL in nats. Settings as for "
       f"perplexity (YaRN factor L/T; fixed s = longest / T at every length). This study is "
       f"not in the paper.\n"]
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
            for x, c in zip(lengths, cells)}
        L.append(f"| {_name(e)} | {SETTINGS[s]} | "
                 + " | ".join(rs.fmt_interval(c) for c in cells) + " |")
    L.append("")
  for key, title, claim in (("sample_correct", "accuracy", "higher"),
                            ("sample_nll", "answer NLL", "lower")):
    L += [f"RoVE minus the other encoding, {title} (verdict on \"RoVE is {claim}\"):\n",
          head.replace("| encoding |", "| comparison |"), rule]
    for a, b in st.pairs(encs):
      for s in settings:
        cells = [st.recall_cmp(a, b, s, [x], key) for x in lengths]
        if all(c is None for c in cells):
          continue
        L.append(f"| {_name(a)} - {_name(b)} | {SETTINGS[s]} | " + " | ".join(
            "-" if c is None else f"{rs.fmt_change(c)} "
            + ("at the ceiling" if rs.at_ceiling(_counts(st, a, b, s, [x]))
               else rs.verdict(c, claim))
            for x, c in zip(lengths, cells)) + " |")
    L.append("")
  png = plots.retrieval_study(st.recall, train_lengths=[T] if T else [],
                              title="Retrieval study: accuracy and answer NLL vs length")
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
    text += (f"at the training length ({T} tokens) accuracy is "
             + ", ".join(f"{_name(e)} {rs.fmt_interval(acc(e, 'none', T))}" for e in encs
                         if acc(e, "none", T) is not None) + ". ")
  if ("rove", "rope") not in st.pairs(encs):
    return text + "No RoVE-RoPE comparison (both are needed)."
  parts = []
  for key, what, claim in (("sample_correct", "accuracy", "higher"),
                           ("sample_nll", "answer NLL", "lower")):
    tally = {"supports": 0, "contradicts": 0, "inconclusive": 0, "floor": 0, "ceiling": 0}
    for s in settings:
      for x in (x for x in lengths if T is None or x > T):
        c = st.recall_cmp("rove", "rope", s, [x], key)
        if c is None:
          continue
        counts = _counts(st, "rove", "rope", s, [x])
        if key == "sample_correct" and rs.at_floor(counts):
          tally["floor"] += 1
        elif rs.at_ceiling(counts):
          tally["ceiling"] += 1
        else:
          tally[rs.verdict(c, claim)] += 1
    other = "lower" if claim == "higher" else "higher"
    parts.append(f"RoVE's {what} is {claim} than RoPE's (interval excluding 0) in "
                 f"{tally['supports']}, {other} in {tally['contradicts']}, and the interval "
                 f"includes 0 in {tally['inconclusive']}"
                 + (f", both at the floor in {tally['floor']}" if tally["floor"] else "")
                 + (f", both at the ceiling (no verdict) in {tally['ceiling']}"
                    if tally["ceiling"] else ""))
    cells = sum(tally.values())
  text += (f"Of the {cells} length-setting cells past the training length, "
           + "; ".join(parts) + ". ")
  x = lengths[-1]
  text += f"At the longest length ({x} tokens, {_x(x, T)}), accuracy RoVE vs RoPE: " + "; ".join(
      f"{SETTINGS[s]} {rs.fmt_interval(acc('rove', s, x))} vs "
      f"{rs.fmt_interval(acc('rope', s, x))}" for s in settings) + "."
  return text


# ---------------------------------------------------------------------------------- claims


def rows(st: rs.Study, base) -> list:
  """The claim-by-claim rows (RoVE vs RoPE), [] without both encodings."""
  if not {"rove", "rope"} <= set(st.groups):
    return []
  out = _icl_rows(st, base)
  c = st.ppl_cmp("rove", "rope", "none", base)
  if c is not None:
    out.append(_row("b", f"perplexity at the training length ({base} tokens), no YaRN: "
                         f"RoVE / RoPE - 1", rs.fmt_change(c), rs.verdict(c), result=c))
  longer = [x for x in _ppl_lengths(st) if x > base]
  for s in SETTINGS:
    for x in longer:
      c = st.ppl_cmp("rove", "rope", s, x)
      if c is not None:
        out.append(_row("c", f"perplexity at {x} tokens ({_x(x, base)}), {SETTINGS[s]}: "
                             f"RoVE / RoPE - 1", rs.fmt_change(c), rs.verdict(c), result=c))
  out += _yarn_rows(st, base, longer)
  out += _ruler_rows(st, base)
  out += _recall_rows(st)
  return out


def _icl_rows(st, base) -> list:
  tasks = st.icl_tasks()
  if not tasks:
    return []
  counts = [st.icl_count(e, tasks) for e in ("rove", "rope")]
  shown = f"RoVE {rs.fmt_count(counts[0])}, RoPE {rs.fmt_count(counts[1])} correct"
  test = (f"synthetic ICL, {len(tasks)} tasks, inside the {base}-token training context: "
          f"greedy exact match over all prompts and seeds (the paper measures DCLM-Core)")
  if rs.at_floor(counts):
    out = [_row("a", test, shown, f"at the floor: {shown}")]
  else:
    c = st.icl_cmp("rove", "rope", tasks, 1)
    out = [_row("a", test, f"{rs.fmt_change(c, 3)} ({shown})", rs.verdict(c, "higher"),
                result=c)]
  c = st.icl_cmp("rove", "rope", tasks, 0)
  out.append(_row("a", "the same prompts' answer NLL (mean, nats): RoVE - RoPE",
                  rs.fmt_change(c), rs.verdict(c), result=c))
  return out


def _yarn_rows(st, base, longer) -> list:
  out = []
  for s in ("yarn", "yarn_fixed"):
    for x in longer:
      ch = {e: st.yarn_change(e, s, x) for e in ("rove", "rope")}
      if None in ch.values():
        continue
      out.append(_row("d1", f"{SETTINGS[s]} vs no YaRN at {x} tokens ({_x(x, base)}), same "
                            f"runs: perplexity ratio - 1 for each encoding",
                      f"RoVE {_pct(ch['rove'])}; RoPE {_pct(ch['rope'])}",
                      _both([rs.interval_verdict(ch[e]) for e in ch])))
  for s in ("yarn", "yarn_fixed"):
    for x in longer:
      without, with_, kept = (st.ppl_cmp("rove", "rope", "none", x),
                              st.ppl_cmp("rove", "rope", s, x), st.gap_kept(s, x))
      if None in (without, with_, kept):
        continue
      verdict = rs.verdict(kept)
      if rs.verdict(without) != "supports":
        verdict = "inconclusive: no RoVE-RoPE gap without YaRN to preserve"
      out.append(_row(
          "d2", f"at {x} tokens ({_x(x, base)}), {SETTINGS[s]}: is the RoVE-RoPE log-perplexity "
                f"gap with YaRN at least half the gap without (\"largely\" read so here)? "
                f"Figure: gap with - 0.5 x gap without, below 0 supports",
          f"gap without {rs.fmt_change(without)}, with {rs.fmt_change(with_)}; test "
          f"{rs.fmt_change(kept, 3)} nats", verdict, result=kept))
  return out


def _ruler_rows(st, base) -> list:
  out = []
  for s in ("none", "yarn"):
    lengths = st.ruler_lengths(s)
    if "rove" not in st.ruler_encodings(s) or "rope" not in st.ruler_encodings(s):
      continue
    for task in ["mean"] + list(lengths):
      c = st.ruler_cmp("rove", "rope", s, task)
      counts = [st.ruler_count(e, s, task) for e in ("rove", "rope")]
      em = f"exact match RoVE {rs.fmt_count(counts[0])}, RoPE {rs.fmt_count(counts[1])}"
      if task == "mean":
        lens = sorted({x for ls in lengths.values() for x in ls})
        test = (f"RULER answer NLL, mean over {len(lengths)} tasks at "
                f"{', '.join(map(str, lens))} tokens, {SETTINGS[s]}: RoVE - RoPE (the paper: "
                f"4k/8k tokens at a 1024-token context)")
        claim = CLAIMS["e"]
      else:
        test = (f"RULER {task} answer NLL, mean over {', '.join(map(str, lengths[task]))} "
                f"tokens, {SETTINGS[s]}: RoVE - RoPE")
        claim = f"{CLAIMS['e'].split(' (')[0]} (abstract; Sec. 4): RULER task {task}"
        if task in rs.AGGREGATION:
          claim += " (an aggregation task in RULER's own categories: bears on (f))"
      out.append(_row("e", test, f"{rs.fmt_change(c)} nats; {em}", rs.verdict(c), claim,
                      result=c))
    d = st.ruler_cmp("rove", "rope", s, "agg-other")
    agg = [t for t in lengths if t in rs.AGGREGATION]
    test = (f"RULER, {SETTINGS[s]}: RoVE - RoPE NLL on RULER's aggregation tasks "
            f"({', '.join(agg) or 'none scored'}; RULER's category, the paper names no task) "
            f"minus the same on the other tasks; below 0: larger improvement on aggregation")
    if d is None:
      out.append(_row("f", test, "-", "not measured"))
      continue
    figure = (f"aggregation {rs.fmt_change(st.ruler_cmp('rove', 'rope', s, 'agg'))}; others "
              f"{rs.fmt_change(st.ruler_cmp('rove', 'rope', s, 'other'))}; "
              f"difference {rs.fmt_change(d)}")
    out.append(_row("f", test, figure, rs.verdict(d), result=d))
  return out


def _recall_rows(st) -> list:
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
    test = (f"retrieval study (not in the paper), {SETTINGS[s]}: accuracy, mean over "
            f"{where} tokens (past T = {T}), RoVE - RoPE")
    shown = f"RoVE {rs.fmt_count(counts[0])}, RoPE {rs.fmt_count(counts[1])} correct"
    if c is None:
      continue
    ceiling = rs.at_ceiling(counts)
    if rs.at_floor(counts):
      out.append(_row("e", test, shown, f"at the floor: {shown}", claim, recall=s))
    else:
      out.append(_row("e", test, f"{rs.fmt_change(c, 3)} ({shown})",
                      f"at the ceiling: {shown}" if ceiling else rs.verdict(c, "higher"),
                      claim, result=c, recall=s))
    c = st.recall_cmp("rove", "rope", s, longer, "sample_nll")
    out.append(_row("e", f"retrieval study, {SETTINGS[s]}: answer NLL, mean over {where} "
                         f"tokens, RoVE - RoPE", rs.fmt_change(c) + " nats",
                    "at the ceiling: every answer right, no verdict" if ceiling
                    else rs.verdict(c), claim, result=c))
  return out


def table(rows_: list) -> list:
  L = ["## The paper's claims, one by one\n"]
  if not rows_:
    return L + ["Needs RoVE and RoPE runs.\n"]
  L += ["Claims of the paper's abstract and Section 4, RoVE against RoPE; every RULER task has a "
        "row with and without YaRN. Figures: estimate [95 % interval]; verdicts from the "
        "interval (see \"How the intervals are computed\").\n",
        "| # | the paper's claim (where) | test here | figure [95 % interval] | verdict |",
        "|---|---|---|---|---|"]
  for r in rows_:
    L.append(f"| {r['id']} | {r['claim']} | {r['test']} | {r['figure']} | {r['verdict']} |")
  L.append("\nTally: " + ", ".join(f"{k}: {n}" for k, n in tally(rows_).items()) + ".\n")
  return L


def tally(rows_: list) -> dict:
  out = {}
  for r in rows_:
    key = r["verdict"].split(":")[0]
    out[key] = out.get(key, 0) + 1
  return dict(sorted(out.items()))


def closing(st: rs.Study, base, rows_: list, meta: dict) -> list:
  """The closing note: wall time and the headline numbers with their intervals."""
  what = ""
  if st.recall:
    what = (", retrieval study included" if meta.get("recall_rerun", True)
            else "; the retrieval study's records are an earlier run's, not rerun")
  L = ["## Closing note\n",
       f"Wall time {meta['wall_seconds'] / 60:.1f} min (training and evaluation{what})."]
  if not rows_:
    return L + [""]
  lengths = _ppl_lengths(st)
  heads = []
  c = st.ppl_cmp("rove", "rope", "none", base)
  if c is not None:
    heads.append(f"in-context perplexity, RoVE / RoPE - 1: {rs.fmt_change(c)}")
  if lengths and lengths[-1] > base:
    x = lengths[-1]
    got = [(s, st.ppl_cmp("rove", "rope", s, x)) for s in SETTINGS]
    heads.append(f"perplexity at {x} tokens ({_x(x, base)}): " + "; ".join(
        f"{SETTINGS[s]} {rs.fmt_change(c)}" for s, c in got if c is not None))
  got = [(s, st.ruler_cmp("rove", "rope", s, "mean")) for s in ("none", "yarn")]
  if any(c is not None for _, c in got):
    heads.append("RULER mean answer NLL, RoVE - RoPE: " + "; ".join(
        f"{SETTINGS[s]} {rs.fmt_change(c)}" for s, c in got if c is not None))
  icl = [r["figure"] for r in rows_ if r["id"] == "a"]
  if icl:
    heads.append("ICL inside the training context: " + icl[0] + (
        f"; answer NLL, RoVE - RoPE: {icl[1]}" if len(icl) > 1 else ""))
  heads += [f"retrieval study, accuracy past its training length, {SETTINGS[r['recall']]}, "
            f"RoVE - RoPE: {r['figure']}" for r in rows_ if r.get("recall")]
  L.append("Headline numbers (95 % intervals):\n")
  L += [f"- {h}" for h in heads]
  L.append("- claim rows: " + ", ".join(f"{k} {n}" for k, n in tally(rows_).items()))
  L.append("")
  return L
