"""The write-up's own figures, as PNG bytes: the retrieval study's curves and the training loss
curves, drawn with rove_jax.evaluation.plots' conventions and helpers (matplotlib is imported
only when a figure is drawn). study/writeup.py and study/retrieval.py write the files.
"""

from __future__ import annotations

from typing import Optional, Sequence

from rove_jax.evaluation import plots as eval_plots

LOSS_COLORS = eval_plots.ENCODING_COLORS  # an encoding has the same colour in every figure


def retrieval_study(
  records: Sequence[dict],
  *,
  title: str = "Retrieval vs evaluation length",
  train_lengths: Sequence[int] = (),
) -> Optional[bytes]:
  """Accuracy (left) and answer NLL (right) against evaluation length: the figure of
  rove_jax.evaluation.plots.retrieval_figure (its docstring describes `records`, `title`,
  `train_lengths` and the ValueError on a bad record) as PNG bytes, or None when `records`
  is empty."""
  fig = eval_plots.retrieval_figure(records, title=title, train_lengths=train_lengths)
  return None if fig is None else eval_plots.png(fig, 120)


def loss_curves(curves: dict, runs: list, names: dict) -> Optional[bytes]:
  """Training and held-out loss against step, one line per run.

  Args:
    curves: {workdir: metrics rows (rove_jax.train.metrics.read_metrics)}.
    runs: [{"workdir", "encoding", "seed"}], the runs to draw.
    names: display names by encoding.

  Returns:
    PNG bytes, or None when no run logged a training loss.
  """
  fig, axes = eval_plots.pyplot().subplots(1, 2, figsize=(11, 4))
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
    eval_plots.pyplot().close(fig)
    return None
  axes[0].set(title="training loss", xlabel="step", ylabel="nats / byte")
  axes[1].set(title="held-out loss", xlabel="step", ylabel="nats / byte")
  for ax in axes:
    ax.grid(alpha=0.3)
    eval_plots.legend(ax)
  fig.tight_layout()
  return eval_plots.png(fig, 110)


def gap_vs_steps(
  gaps: dict,
  *,
  title: str = "RoVE - RoPE held-out loss against training steps",
  margin: Optional[float] = None,
) -> Optional[bytes]:
  """Every seed pair's RoVE - RoPE held-out loss at each step (points, spread a little
  sideways), the mean over pairs (line) and its 95 % paired t-interval (band).

  Args:
    gaps: {step: [difference per pair, in the same pair order at every step]}.
    margin: drawn as dashed lines at +-margin (an equivalence margin), when given.

  Returns:
    PNG bytes, or None without steps.
  """
  from study import multiplicity

  steps = sorted(s for s in gaps if gaps[s])
  if not steps:
    return None
  plt = eval_plots.pyplot()
  fig, ax = plt.subplots(figsize=(8, 4.5))
  width = 0.25 * (steps[1] - steps[0]) if len(steps) > 1 else 1.0
  n = max(len(gaps[s]) for s in steps)
  for s in steps:
    xs = [s + width * ((i + 0.5) / n - 0.5) for i in range(len(gaps[s]))]
    ax.scatter(
      xs,
      gaps[s],
      s=12,
      color="tab:gray",
      alpha=0.8,
      label="one seed pair" if s == steps[0] else None,
    )
  ts = [multiplicity.paired_t(gaps[s]) for s in steps]
  if all(ts):
    ax.plot(
      steps,
      [t["mean"] for t in ts],
      "-o",
      color=LOSS_COLORS.get("rove", "C3"),
      ms=4,
      label="mean over pairs",
    )
    ax.fill_between(
      steps,
      [t["lower"] for t in ts],
      [t["upper"] for t in ts],
      alpha=0.2,
      color=LOSS_COLORS.get("rove", "C3"),
      label="95 % t-interval",
    )
  ax.axhline(0, color="black", lw=0.8)
  if margin:
    for y in (-margin, margin):
      ax.axhline(
        y,
        color="black",
        lw=0.8,
        ls="--",
        label=f"+-{margin:.4f} (equivalence margin)" if y < 0 else None,
      )
  ax.set(title=title, xlabel="training step", ylabel="RoVE - RoPE (nats / byte; < 0: RoVE lower)")
  ax.grid(alpha=0.3)
  eval_plots.legend(ax)
  fig.tight_layout()
  return eval_plots.png(fig, 110)
