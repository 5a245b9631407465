"""results/long/README.md for the second study (study/long_study.py, preregistered in
study/preregistration_long.md).

Until every primary pair is evaluated it is a progress report: which runs are trained and
evaluated, the sweep's table once written, and no verdict, interval or p-value of the family
(the preregistration's stopping rule).
"""

from __future__ import annotations

import os

from study import long_study
from study import sweep

README = "README.md"


def progress_lines(out: str, runs_dir: str) -> list[str]:
  """The progress paragraph: runs evaluated out of planned, per stage."""
  st = long_study.status(out, runs_dir)
  lines = ["## Progress\n"]
  for stage, (done, n) in st.items():
    lines.append(f"- {stage}: {done} of {n} runs trained and evaluated")
  if "primary" not in st:
    lines.append("- primary: not planned yet (the sweep has not chosen both rates)")
  return lines + [""]


def write(out: str, runs_dir: str) -> str:
  """Writes <out>/README.md; returns its path."""
  rec = sweep.load_record(out)
  L = ["# Second study: RoVE vs RoPE at 2,000 steps (in progress)\n",
       "Pre-registered in [study/preregistration_long.md](../../study/preregistration_long.md) "
       "before any of its runs trained. Until all 10 seed pairs are evaluated this page reports "
       "progress only: no verdict, interval or p-value of the primary family.\n",
       *progress_lines(out, runs_dir)]
  if rec:
    L += sweep.section(rec)
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, README)
  with open(path, "w") as f:
    f.write("\n".join(L) + "\n")
  return path
