"""The evaluation's figures, each rendered to PNG bytes (matplotlib, Agg backend).

The writers own the files: report.write places perplexity / ruler / icl / figure1 next to
report.json, results_writeup.write places loss_curves in results/, both atomically. A function
returns None when the report holds nothing it could draw.
"""

from __future__ import annotations

import io
from typing import Optional

import numpy as np

from rove_jax import analysis
from rove_jax.evaluation.report import train_len


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def png(fig, dpi: int) -> bytes:
  """The figure as PNG bytes; the figure is closed."""
  buf = io.BytesIO()
  try:
    fig.savefig(buf, format="png", dpi=dpi)
  finally:
    pyplot().close(fig)
  return buf.getvalue()


def legend(ax) -> None:
  """A small legend, drawn only when the axes hold labelled artists (matplotlib warns on an
  empty one)."""
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7)


def perplexity(report: dict) -> Optional[bytes]:
  """Perplexity against evaluation length, with and without YaRN, one line per run."""
  runs = [r for r in report["runs"] if r.get("perplexity")]
  if not runs:
    return None
  fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
  for r in runs:
    for setting, style in (("none", "-"), ("yarn", "--")):
      rows = r["perplexity"].get(setting)
      if not rows or "not_applicable" in rows:
        continue
      lengths = sorted(int(L) for L in rows)
      yarn = " + YaRN" if setting == "yarn" else ""
      ax.plot(lengths, [rows[str(L)]["ppl"] for L in lengths], style, marker="o",
              label=f"{r['name']} ({r['model']['pos_encoding']}{yarn})")
  ax.axvline(train_len(runs[0]), color="gray", lw=0.8, ls=":")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("evaluation length (tokens)")
  ax.set_ylabel("perplexity")
  ax.set_title("Perplexity vs length (dotted: training length)")
  legend(ax)
  fig.tight_layout()
  return png(fig, 120)


def _bars(runs, tasks, value, *, ylabel, title, ylim=None) -> bytes:
  """Grouped bars: one group per task, one bar per run."""
  fig, ax = pyplot().subplots(figsize=(max(6, 0.7 * len(tasks) * len(runs)), 4))
  width = 0.8 / len(runs)
  for i, r in enumerate(runs):
    ax.bar(np.arange(len(tasks)) + i * width, [value(r, t) for t in tasks], width,
           label=r["name"])
  ax.set_xticks(np.arange(len(tasks)) + 0.4 - width / 2)
  ax.set_xticklabels(tasks, rotation=45, ha="right", fontsize=7)
  if ylim:
    ax.set_ylim(*ylim)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  legend(ax)
  fig.tight_layout()
  return png(fig, 120)


def ruler(report: dict) -> Optional[bytes]:
  """Each RULER task's answer NLL (mean over lengths), one bar per run."""
  runs = [r for r in report["runs"] if r.get("ruler") and r["ruler"]["tasks"]]
  if not runs:
    return None
  tasks = sorted({t for r in runs for t in r["ruler"]["tasks"]})

  def mean_nll(r, t):
    rows = r["ruler"]["tasks"].get(t, {})
    return np.mean([row["nll"] for row in rows.values()]) if rows else np.nan

  return _bars(runs, tasks, mean_nll, ylabel="answer NLL (mean over lengths)", title="RULER")


def icl(report: dict) -> Optional[bytes]:
  """Each synthetic ICL task's accuracy, one bar per run."""
  runs = [r for r in report["runs"] if r.get("icl") and r["icl"].get("synthetic")]
  if not runs:
    return None
  tasks = sorted({t for r in runs for t in r["icl"]["synthetic"]["tasks"]})
  accuracy = lambda r, t: r["icl"]["synthetic"]["tasks"].get(t, {}).get("accuracy", np.nan)
  return _bars(runs, tasks, accuracy, ylabel="accuracy",
               title="In-context learning (synthetic)", ylim=(0, 1))


def figure1(model, tokens_T, *, title: str, layer: int = 0, head: int = 0) -> bytes:
  """The paper's Figure 1 for a trained layer: RoPE's mixer A (x) W_V next to RoVE's
  block-Toeplitz mixer [A_ij R_{j-i} W_V], on the same attention weights."""
  view = analysis.layer_attention(model, tokens_T, layer=layer, head=head)
  T = len(tokens_T)
  # The four fastest-turning rotary pairs against the first 8 input features: small enough to
  # see the per-token blocks, and where the rotations differ most.
  features = min(8, view["w_v"].shape[1])
  m = analysis.figure1_mixers(view, pairs=4, features=features)
  rope, rove, dims = m["rope"], m["rove"], len(m["dims"])
  fig, axes = pyplot().subplots(1, 2, figsize=(10, 4.5))
  vmax = float(np.percentile(np.abs(rope), 99.5)) or 1.0
  for ax, mat, name in ((axes[0], rope, "RoPE: A \u2297 W_V"),
                        (axes[1], rove, "RoVE: [A_ij R_{j-i} W_V] (block Toeplitz up to A)")):
    ax.imshow(mat, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_title(name, fontsize=9)
    ax.set_xlabel(f"input: {T} tokens x first {features} features")
    ax.set_ylabel(f"output: {T} tokens x {dims} head dims (first {dims // 2} rotary pairs)")
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return png(fig, 110)


LOSS_COLORS = {"rove": "tab:red", "rope": "tab:blue", "nope": "tab:gray"}


def loss_curves(curves: dict, runs: list, names: dict) -> Optional[bytes]:
  """Training and held-out loss against step, one line per run.

  Args:
    curves: {workdir: metrics rows (rove_jax.metrics_log.read_metrics)}.
    runs: [{"workdir", "encoding", "seed"}], the runs to draw.
    names: display names by encoding.

  Returns:
    PNG bytes, or None when no run logged a training loss.
  """
  fig, axes = pyplot().subplots(1, 2, figsize=(11, 4))
  drew = False
  for i, run in enumerate(runs):
    rows = curves.get(run["workdir"]) or []
    c = LOSS_COLORS.get(run["encoding"], f"C{i}")
    style = ["-", "--", ":", "-."][run["seed"] % 4]
    label = f"{names.get(run['encoding'], run['encoding'])} seed {run['seed']}"
    tr = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    va = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if tr:
      axes[0].plot(*zip(*tr), style, color=c, label=label, lw=1)
      drew = True
    if va:
      axes[1].plot(*zip(*va), style + "o", color=c, label=label, ms=3)
  if not drew:
    pyplot().close(fig)
    return None
  axes[0].set(title="training loss", xlabel="step", ylabel="nats / byte")
  axes[1].set(title="held-out loss", xlabel="step", ylabel="nats / byte")
  for ax in axes:
    ax.grid(alpha=0.3)
    legend(ax)
  fig.tight_layout()
  return png(fig, 110)
