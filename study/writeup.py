"""results/README.md for `make reproduce`: the paper's tables with 95 % intervals over seeds and
evaluation units, per-run rows (every run made), loss curves, the retrieval study, and a
claim-by-claim table against the paper, all computed from the numbers (never written by hand).

write(out_dir, report, runs, curves, meta, recall=None) is called by reproduce.py; `report` is
the schema-v2 report.json of `rove-eval --compare` over all runs, `recall` the retrieval
study's records (rove_jax.evaluation.recall.evaluate's). This module puts the sections in
order and writes the files: the intervals and comparisons come from study.stats
(stats.mean_interval / stats.paired_difference) through study.numbers; the section on how they
are computed from study.method, the paper's tables from study.tables, the retrieval-study
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
  limits,
  method,
  plots,
  position_tasks,
  primary,
  run_info,
  sweep,
  tables,
)
from study import claims as claims_lib
from study import numbers as rs

RECALL_PNG = "retrieval_study.png"
POSITION_PNG = "position_retrieval.png"


def _train_len(report: dict):
  """The runs' training length; refuses runs trained at different lengths."""
  found = {train_len(r) for r in report["runs"]}
  if len(found) > 1:
    raise ValueError(
      f"the runs were trained at different lengths {sorted(found)}; the write-up "
      f"compares matched runs only"
    )
  return found.pop() if found else None


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
  L = run_info.header(st, meta) + sweep.section(meta.get("lr_sweep")) + method.section(st)
  L += tables.table1(st, base, summary)
  L += tables.perplexity(st, base, summary) + tables.ruler(st, base, summary)
  L += tables.icl(st, summary)
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
