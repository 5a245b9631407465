"""results/README.md for `make reproduce`: the paper's tables with the mean and spread over
seeds, per-run rows (every run made), loss curves, and a claim-by-claim comparison with the
paper computed from the numbers (never written by hand).

write(out_dir, report, runs, curves, meta) is called by reproduce.py; `report` is the
schema-v1 report.json of `rove-eval --compare` over all runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Optional

import numpy as np

from rove_jax.evaluation.report import replace_files, train_len

NAMES = {"rove": "RoVE", "rope": "RoPE", "nope": "NoPE", "learned": "learned",
         "sinusoidal": "sinusoidal", "t5_bias": "T5 bias"}


# --------------------------------------------------------------------------- aggregation


def _by_encoding(report: dict) -> dict:
  groups = {}
  for run in report["runs"]:
    groups.setdefault(run["model"]["pos_encoding"], []).append(run)
  return groups


def _ppl(run, setting, length, key="ppl") -> Optional[float]:
  """A perplexity-table number (`key` "ppl" or "loss") of one run, or None if not measured."""
  rows = (run.get("perplexity") or {}).get(setting) or {}
  row = rows.get(str(length))
  return None if row is None or key not in row else float(row[key])


def _ruler_nll(run, task, length=None) -> Optional[float]:
  rows = ((run.get("ruler") or {}).get("tasks") or {}).get(task)
  if not rows:
    return None
  if length is not None:
    return float(rows[str(length)]["nll"]) if str(length) in rows else None
  return float(np.mean([r["nll"] for r in rows.values()]))


def _icl_acc(run) -> Optional[float]:
  syn = ((run.get("icl") or {}).get("synthetic") or {})
  return None if syn.get("accuracy") is None else float(syn["accuracy"])


def _icl_nll(run) -> Optional[float]:
  """Mean answer NLL over the synthetic ICL tasks and their settings."""
  tasks = ((run.get("icl") or {}).get("synthetic") or {}).get("tasks") or {}
  vals = [v for t in tasks.values() for k, d in t.items() if k.startswith("nll_by_")
          for v in d.values()]
  return float(np.mean(vals)) if vals else None


def _best_ruler_em(report) -> float:
  return max([float(row["exact_match"]) for run in report["runs"]
              for rows in ((run.get("ruler") or {}).get("tasks") or {}).values()
              for row in rows.values()] or [0.0])


def stats(values) -> Optional[dict]:
  """mean, spread (half the range: with two seeds, the distance of each from the mean), n."""
  vals = [v for v in values if v is not None and math.isfinite(v)]
  if not vals:
    return None
  return {"mean": float(np.mean(vals)), "spread": float((max(vals) - min(vals)) / 2),
          "n": len(vals), "values": vals}


def _fmt(s: Optional[dict], digits=3) -> str:
  if s is None:
    return "-"
  if s["n"] == 1:
    return f"{s['mean']:.{digits}f}"
  return f"{s['mean']:.{digits}f} ± {s['spread']:.{digits}f}"


# ------------------------------------------------------------------------------ verdicts


def compare(better: Optional[dict], worse: Optional[dict], lower_is_better=True) -> str:
  """Does `better` (RoVE) beat `worse` (RoPE) as the paper says? Beyond the noise band means
  the gap exceeds the sum of the two half-ranges over seeds."""
  if better is None or worse is None:
    return "not measured"
  gap = (worse["mean"] - better["mean"]) if lower_is_better else (better["mean"] - worse["mean"])
  noise = better["spread"] + worse["spread"]
  single = better["n"] < 2 or worse["n"] < 2
  rel = gap / abs(worse["mean"]) if worse["mean"] else float("nan")
  where = (f"(RoVE {abs(rel):.1%} {'better' if gap > 0 else 'worse'})"
           if math.isfinite(rel) and gap else "")
  if gap == 0:
    return "tie"
  if gap > 0:
    verdict = "agrees" if (gap > noise and not single) else "same direction, within the seed noise"
  else:
    verdict = "disagrees" if (-gap > noise and not single) else "opposite direction, within the seed noise"
  if single:
    verdict += " (one seed: no noise estimate)"
  return f"{verdict} {where}".strip()


# -------------------------------------------------------------------------------- writing


def _lengths(report, setting="none") -> list[int]:
  out = set()
  for run in report["runs"]:
    rows = (run.get("perplexity") or {}).get(setting) or {}
    out |= {int(k) for k in rows if k.isdigit()}
  return sorted(out)


def _ruler_tasks(report) -> tuple[list[str], list[int]]:
  tasks, lengths = set(), set()
  for run in report["runs"]:
    for t, rows in ((run.get("ruler") or {}).get("tasks") or {}).items():
      tasks.add(t)
      lengths |= {int(k) for k in rows}
  return sorted(tasks), sorted(lengths)


def _minutes(run_report) -> str:
  seconds = (run_report or {}).get("seconds") or {}
  return f"{sum(seconds.values()) / 60:.1f}" if seconds else "-"


def _train_len(report: dict, lengths: list):
  """The runs' training length (report runs[].model.train_len); reports written before that
  field existed: the shortest evaluated length, which the suites set to the training length."""
  found = {r["model"]["train_len"] for r in report["runs"] if "train_len" in r["model"]}
  if len(found) > 1:
    raise ValueError(f"the runs were trained at different lengths {sorted(found)}; the write-up "
                     f"compares matched runs only")
  return found.pop() if found else (lengths[0] if lengths else None)


def build(report: dict, runs: list[dict], curves: dict, meta: dict) -> tuple[str, dict]:
  """(markdown, summary dict) for results/README.md and results/summary.json."""
  groups = _by_encoding(report)
  order = [e for e in ("rove", "rope", "nope") if e in groups] + \
          [e for e in groups if e not in ("rove", "rope", "nope")]
  lengths = _lengths(report)
  yarn_lengths = _lengths(report, "yarn")
  base = _train_len(report, lengths)
  tasks, r_lengths = _ruler_tasks(report)
  summary = {"encodings": {}, "claims": []}
  L = []
  L.append("# Small-scale replication: RoVE vs RoPE (vs NoPE)\n")
  if meta.get("quick"):
    L.append("**This is a --quick smoke run (tiny model, a few steps): its numbers mean nothing "
             "about RoVE.**\n")
  first = report["runs"][0]["model"]
  steps = sorted({r["step"] for r in report["runs"]})
  L.append(
      f"Every run: a {first['n_layer']}-layer GPT, d_model {first['d_model']}, "
      f"{first['n_head']} heads, {first['params']:,} parameters, training context "
      f"{train_len(report['runs'][0])} byte tokens, trained on the embedded stdlib corpus for "
      f"{', '.join(map(str, steps))} steps (configs/reproduce.py); the runs differ only in the "
      f"positional encoding and the seed. {len(report['runs'])} runs, all reported below.\n")
  L.append(f"- Command: `{meta['command'].strip()}` (`make reproduce`)")
  L.append(f"- Commit: {meta['commit']}")
  L.append(f"- Started: {meta['started']}; wall time {meta['wall_seconds'] / 60:.1f} min "
           f"(training and evaluation)")
  L.append(f"- Machine: {meta['machine']}")
  if meta.get("notes"):
    L.append(f"- Notes: {meta['notes']}")
  L.append(f"- Evaluation: `rove-eval --suite {report['suite']} --compare ...`; "
           f"full report in [eval/report.md](eval/report.md), raw numbers in "
           f"[eval/report.json](eval/report.json).")
  L.append("- Spread: ± is half the range over seeds (with two seeds, each seed's distance from "
           "the mean). A difference counts as real below only when it exceeds the two "
           "encodings' spreads added together.\n")

  # Table 1: in-context.
  L.append("## Table 1: in-context loss, perplexity and in-context learning\n")
  L.append(f"Held-out loss and perplexity at the training length ({base} tokens), no YaRN; "
           "synthetic ICL accuracy (exact match) and mean answer NLL over the synthetic ICL "
           "tasks.\n")
  L.append("| encoding | seeds | loss (nats/byte) | perplexity | ICL accuracy | ICL answer NLL |")
  L.append("|---|---|---|---|---|---|")
  for enc in order:
    rs = groups[enc]
    row = {"loss": stats([_ppl(r, "none", base, "loss") for r in rs]),
           "ppl": stats([_ppl(r, "none", base) for r in rs]),
           "icl_acc": stats([_icl_acc(r) for r in rs]),
           "icl_nll": stats([_icl_nll(r) for r in rs])}
    summary["encodings"][enc] = {"table1": row}
    L.append(f"| {NAMES.get(enc, enc)} | {len(rs)} | {_fmt(row['loss'], 4)} | "
             f"{_fmt(row['ppl'])} | {_fmt(row['icl_acc'])} | {_fmt(row['icl_nll'])} |")
  L.append("")

  # OOD perplexity.
  L.append("## Perplexity by evaluation length, without and with YaRN\n")
  L.append("YaRN factor = length / training length, applied at inference only (the rotary "
           "encodings; NoPE has no frequencies to scale).\n")
  L.append("| encoding | YaRN | " + " | ".join(f"{n} ({n // base}x)" for n in lengths) + " |")
  L.append("|---|---|" + "---|" * len(lengths))
  for enc in order:
    rs = groups[enc]
    for setting in ("none", "yarn"):
      cells = [stats([_ppl(r, setting, n) for r in rs]) for n in lengths]
      if all(c is None for c in cells):
        continue
      summary["encodings"][enc].setdefault("ppl", {})[setting] = {
          str(n): c for n, c in zip(lengths, cells)}
      L.append(f"| {NAMES.get(enc, enc)} | {'yes' if setting == 'yarn' else 'no'} | "
               + " | ".join(_fmt(c, 2) for c in cells) + " |")
  L.append("\n![perplexity vs length](eval/perplexity_vs_length.png)\n")

  # Table 2: RULER.
  if tasks:
    L.append("## Table 2: RULER answer NLL by task (lower is better)\n")
    L.append(f"Mean over the evaluation lengths {', '.join(map(str, r_lengths))} tokens "
             f"({', '.join(f'{n // base}x' for n in r_lengths)}), "
             f"{'with YaRN' if any((r.get('ruler') or {}).get('yarn') for r in report['runs']) else 'without YaRN'}"
             f" past the training length. Greedy exact match, best cell of any run: "
             f"{_best_ruler_em(report):.2f} (per task in eval/report.md).\n")
    L.append("| encoding | " + " | ".join(tasks) + " | mean |")
    L.append("|---|" + "---|" * (len(tasks) + 1))
    for enc in order:
      rs = groups[enc]
      cells = [stats([_ruler_nll(r, t) for r in rs]) for t in tasks]
      mean = stats([np.mean([_ruler_nll(r, t) for t in tasks if _ruler_nll(r, t) is not None])
                    for r in rs])
      summary["encodings"][enc]["ruler"] = {t: c for t, c in zip(tasks, cells)}
      summary["encodings"][enc]["ruler"]["mean"] = mean
      L.append(f"| {NAMES.get(enc, enc)} | " + " | ".join(_fmt(c, 2) for c in cells)
               + f" | {_fmt(mean, 2)} |")
    L.append("\n![RULER NLL](eval/ruler_nll.png)\n")

  # Claims.
  if "rove" in groups and "rope" in groups:
    L.append("## Where the small-scale result agrees with the paper, and where not\n")
    L.append("Computed from the tables above (RoVE vs RoPE means, against the seed noise).\n")
    L.append("| the paper says | here |")
    L.append("|---|---|")
    e = summary["encodings"]
    claims = [("RoVE lowers in-context perplexity (training length)",
               compare(e["rove"]["table1"]["ppl"], e["rope"]["table1"]["ppl"])),
              ("RoVE raises in-context-learning accuracy",
               compare(e["rove"]["table1"]["icl_acc"], e["rope"]["table1"]["icl_acc"], False)),
              ("RoVE lowers the answer NLL of in-context-learning tasks",
               compare(e["rove"]["table1"]["icl_nll"], e["rope"]["table1"]["icl_nll"]))]
    for n in lengths[1:]:
      for setting, what in (("none", "without YaRN"), ("yarn", "with YaRN")):
        a = e["rove"].get("ppl", {}).get(setting, {}).get(str(n))
        b = e["rope"].get("ppl", {}).get(setting, {}).get(str(n))
        if a is not None and b is not None:
          claims.append((f"RoVE lowers perplexity at {n} tokens ({n // base}x) {what}",
                         compare(a, b)))
    if tasks:
      claims.append(("RoVE lowers RULER NLL (mean over tasks)",
                     compare(e["rove"]["ruler"]["mean"], e["rope"]["ruler"]["mean"])))
      for t in tasks:
        if t.startswith(("vt", "niah")):
          claims.append((f"RoVE lowers RULER NLL on {t}",
                         compare(e["rove"]["ruler"][t], e["rope"]["ruler"][t])))
    for claim, verdict in claims:
      L.append(f"| {claim} | {verdict} |")
      summary["claims"].append({"claim": claim, "verdict": verdict})
    counts = {}
    for _, v in claims:
      key = v.split(" (")[0]
      counts[key] = counts.get(key, 0) + 1
    L.append("\nTally: " + ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) + ".\n")

  # Every run.
  L.append("## Every run\n")
  L.append("| run | encoding | seed | steps | final train loss | final held-out loss | "
           "training wall (min) | evaluation wall (min) |")
  L.append("|---|---|---|---|---|---|---|---|")
  for run in runs:
    rows = curves.get(run["workdir"]) or []
    tr = [r["loss"] for r in rows if "loss" in r]
    va = [r["val_loss"] for r in rows if "val_loss" in r]
    rep = next((r for r in report["runs"] if os.path.abspath(r["workdir"]) ==
                os.path.abspath(run["workdir"])), None)
    secs = meta.get("train_seconds", {}).get(run["workdir"])
    L.append(f"| {os.path.basename(run['workdir'])} | {NAMES.get(run['encoding'])} | "
             f"{run['seed']} | {rep['step'] if rep else '-'} | "
             f"{f'{tr[-1]:.4f}' if tr else '-'} | {f'{va[-1]:.4f}' if va else '-'} | "
             f"{f'{secs / 60:.1f}' if secs else '-'} | {_minutes(rep)} |")
  L.append("\nPer-run perplexity, RULER and ICL numbers: [eval/report.md](eval/report.md).\n")
  if any("loss" in row for run in runs for row in curves.get(run["workdir"]) or []):
    L.append("![loss curves](loss_curves.png)\n")  # plots.loss_curves draws these rows
  L.append("![Figure 1: the trained model's RoPE vs RoVE token mixers](eval/figure1_mixer.png)\n")
  return "\n".join(L), summary


def write(out_dir: str, report: dict, runs: list[dict], curves: dict, meta: dict) -> dict:
  """Writes README.md, summary.json and loss_curves.png to out_dir, all or none of them
  (report.replace_files); returns the summary."""
  from rove_jax.evaluation import plots
  os.makedirs(out_dir, exist_ok=True)
  text, summary = build(report, runs, curves, meta)
  files = {os.path.join(out_dir, "README.md"): text,
           os.path.join(out_dir, "summary.json"): json.dumps({"meta": meta, **summary}, indent=2)}
  curves_png = plots.loss_curves(curves, runs, NAMES)
  png_path = os.path.join(out_dir, "loss_curves.png")
  if curves_png is not None:
    files[png_path] = curves_png
  replace_files(files)
  if curves_png is None:  # README.md does not link it: no stale curves of an earlier write
    with contextlib.suppress(FileNotFoundError):
      os.remove(png_path)
  return summary
