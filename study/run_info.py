"""results/README.md's account of what ran: the header (the runs, the command, the commit, the
machine, the evaluation's sizing, the learning rates) and the table of every run."""

from __future__ import annotations

import os
import subprocess
from typing import Optional

from rove_jax.evaluation.report import train_len
from study import fmt
from study import numbers as rs


def header(st: rs.Study, meta: dict) -> list:
  report = st.report
  first = report["runs"][0]["model"]
  steps = sorted({r["step"] for r in report["runs"]})
  seeds = "; ".join(f"{fmt.name(e)} {len(st.groups[e])}" for e in st.order)
  L = ["# Small-scale replication: RoVE vs RoPE (vs NoPE)\n"]
  if meta.get("quick"):
    L.append(
      "**This is a --quick smoke run (tiny model, a few steps): its numbers mean nothing "
      "about RoVE.**\n"
    )
  L.append(
    f"Every run: a {first['n_layer']}-layer GPT, d_model {first['d_model']}, "
    f"{first['n_head']} heads, {first['params']:,} parameters, training context "
    f"{train_len(report['runs'][0])} byte tokens, trained on the embedded stdlib corpus for "
    f"{', '.join(map(str, steps))} steps (study/configs/reproduce.py); the runs differ only "
    f"in the "
    f"positional encoding and the seed. {len(report['runs'])} runs (seeds: {seeds}), all "
    f"reported below.\n"
  )
  settings = {s for r in report["runs"] for s in (r.get("perplexity") or {}) if s != "protocol"}
  yarn = "all" if "yarn_fixed" in settings else "both" if "yarn" in settings else "off"
  L.append(f"- Command: `{meta['command'].strip()}` (`make reproduce`)")
  L.append(f"- Commit: {meta['commit']}")
  L.append(
    f"- Started: {meta['started']}; wall time {meta['wall_seconds'] / 60:.1f} min "
    f"(training and evaluation)"
  )
  L.append(f"- Machine: {meta['machine']}")
  if meta.get("notes"):
    L.append(f"- Notes: {meta['notes']}")
  if meta.get("lr_sweep"):  # reproduce.py --sweep-lrs: each rotary encoding at its own rate
    L.append(
      f"- Learning rates: chosen per encoding by the sweep ([{meta['lr_sweep']['file']}]"
      f"({meta['lr_sweep']['file']}), written before these runs trained): "
      + ", ".join(f"{fmt.name(e)} {lr:g}" for e, lr in meta["lr_sweep"]["chosen"].items())
    )
  prereg = preregistration()
  if prereg and meta.get("lr_sweep"):
    import datetime

    before = datetime.datetime.fromisoformat(prereg[1]) < datetime.datetime.fromisoformat(
      meta["started"]
    )
    L.append(
      f"- Pre-registration: [study/preregistration.md](../study/preregistration.md), "
      f"committed on its own in {prereg[0]} at {prereg[1]}, "
      + ("before" if before else "**after**")
      + f" this run started ({meta['started']})"
    )
  L.append(
    f"- Evaluation: `python -m rove_jax.cli.eval --suite {report['suite']} --yarn "
    f"{yarn}{sizing_flags(report)} --compare ...`; full report in "
    f"[eval/report.md](eval/report.md), raw numbers in [eval/report.json](eval/report.json)"
    f".\n"
  )
  return L


def preregistration() -> Optional[tuple]:
  """(commit, ISO date) of the commit that added study/preregistration.md, None outside a git
  checkout or before it is committed."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    out = subprocess.run(
      ["git", "log", "--diff-filter=A", "--format=%H %cI", "--", "study/preregistration.md"],
      cwd=root,
      capture_output=True,
      text=True,
      timeout=30,
    ).stdout.split()
  except (OSError, subprocess.SubprocessError):
    return None
  return (out[-2], out[-1]) if len(out) >= 2 else None


def sizing_flags(report: dict) -> str:
  """The --ppl-tokens and --ruler-lengths the report was scored with (when every run agrees)."""
  runs, flags = report["runs"], ""
  tokens = {((r.get("perplexity") or {}).get("protocol") or {}).get("max_tokens") for r in runs}
  if len(tokens) == 1 and None not in tokens:
    flags += f" --ppl-tokens {tokens.pop()}"
  lengths = {
    tuple(((r.get("ruler") or {}).get("protocol") or {}).get("lengths") or ()) for r in runs
  }
  if len(lengths) == 1 and () not in lengths:
    flags += " --ruler-lengths " + ",".join(map(str, lengths.pop()))
  return flags


def minutes(run_report) -> str:
  seconds = (run_report or {}).get("seconds") or {}
  return f"{sum(seconds.values()) / 60:.1f}" if seconds else "-"


def every_run(reports, runs, curves, meta) -> list:
  L = [
    "## Every run\n",
    "| run | encoding | seed | steps | final train loss | final held-out loss | "
    "training wall (min) | evaluation wall (min) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  evaluated = [r for rep in reports if rep for r in rep["runs"]]
  steps = (meta.get("train") or {}).get("steps", "-")  # runs not evaluated (the LR check)
  for run in runs:
    rows = curves.get(run["workdir"]) or []
    tr = [r["loss"] for r in rows if "loss" in r]
    va = [r["val_loss"] for r in rows if "val_loss" in r]
    rep = next(
      (r for r in evaluated if os.path.abspath(r["workdir"]) == os.path.abspath(run["workdir"])),
      None,
    )
    secs = meta.get("train_seconds", {}).get(run["workdir"])
    L.append(
      f"| {os.path.basename(run['workdir'])} | {fmt.name(run['encoding'])} | "
      f"{run['seed']} | {rep['step'] if rep else run.get('steps') or steps} | "
      f"{f'{tr[-1]:.4f}' if tr else '-'} | {f'{va[-1]:.4f}' if va else '-'} | "
      f"{f'{secs / 60:.1f}' if secs else '-'} | {minutes(rep)} |"
    )
  L.append("\nPer-run perplexity, RULER and ICL numbers: [eval/report.md](eval/report.md).\n")
  if any("loss" in row for run in runs for row in curves.get(run["workdir"]) or []):
    L.append("![loss curves](loss_curves.png)\n")  # plots.loss_curves draws these rows
  L.append("![Figure 1: the trained model's RoPE vs RoVE token mixers](eval/figure1_mixer.png)\n")
  return L
