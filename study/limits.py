"""results/README.md's "What this replication cannot show" paragraph, computed from the runs:
how far training went (tokens, the held-out loss still falling, the RoVE-RoPE held-out gap
over training), the one learning rate every encoding shares, and which rotary frequency pairs
YaRN interpolates at the study's training length."""

from __future__ import annotations

import statistics
from typing import Optional

import numpy as np

from rove_jax.frequencies import yarn_correction_range

YARN_BETAS = (32.0, 1.0)  # transformers' defaults (beta_fast, beta_slow), as evaluated


def yarn_split(head_dim: int, train_len: int, base: float = 10000.0) -> dict:
  """How YaRN's ramp treats the head's frequency pairs at a training length: kept
  (extrapolated), divided by the factor (interpolated), or in between."""
  low, high = yarn_correction_range(
    head_dim,
    base=base,
    original_max_len=train_len,
    beta_fast=YARN_BETAS[0],
    beta_slow=YARN_BETAS[1],
  )
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(head_dim // 2) - low) / (high - low), 0.0, 1.0)
  return {
    "pairs": head_dim // 2,
    "extrapolated": int((ramp == 0).sum()),
    "interpolated": int((ramp == 1).sum()),
    "ramped": int(((ramp > 0) & (ramp < 1)).sum()),
  }


def _val_losses(rows) -> dict:
  return {r["step"]: r["val_loss"] for r in rows or [] if "val_loss" in r}


def held_out_gaps(curves: dict, runs: list, a: str = "rove", b: str = "rope") -> dict:
  """{eval step: mean over seed pairs of A's held-out loss - B's}, steps every pair has."""
  by = {(r["encoding"], r["seed"]): _val_losses(curves.get(r["workdir"])) for r in runs}
  seeds = sorted({s for e, s in by if e == a} & {s for e, s in by if e == b})
  steps = sorted(
    set.intersection(*[set(by[(e, s)]) for s in seeds for e in (a, b)]) if seeds else ()
  )
  return {t: statistics.mean(by[(a, s)][t] - by[(b, s)][t] for s in seeds) for t in steps}


def paragraph(report: dict, runs: list, curves: dict, meta: dict, base: Optional[int]) -> list:
  """The markdown lines (a heading and bullets), from whatever the inputs hold."""
  L = ["## What this replication cannot show\n"]
  train = meta.get("train") or {}
  bullets = []
  if train:
    tokens = train["steps"] * train["batch_size"] * train["seq_len"]
    bullets.append(
      f"Training is short: {train['steps']} steps of {train['batch_size']} x "
      f"{train['seq_len']} tokens ({tokens / 1e6:.2f} M tokens a run), against the paper's "
      "GPT-2 runs on FineWebEdu-10B. "
      + (
        "Each rotary encoding trains at its own learning rate, chosen by the sweep ("
        + ", ".join(f"{e} {lr:g}" for e, lr in meta["lr_sweep"]["chosen"].items())
        + f"; others {train['lr']:g}), warm-up {train['warmup_steps']} steps."
        if meta.get("lr_sweep")
        else f"Every encoding uses one learning rate ({train['lr']:g}, warm-up "
        f"{train['warmup_steps']} steps), not tuned per encoding."
      )
    )
  drops = []
  for r in runs:
    val = _val_losses(curves.get(r["workdir"]))
    if len(val) >= 2:
      steps = sorted(val)
      drops.append((val[steps[-2]] - val[steps[-1]], steps[-2], steps[-1]))
  if drops:
    falling = sum(d > 0 for d, _, _ in drops)
    bullets.append(
      f"The held-out loss was still falling at the end in {falling} of {len(drops)} runs "
      f"(median drop {statistics.median(d for d, _, _ in drops):.3f} nats from step "
      f"{drops[0][1]} to {drops[0][2]}): the comparison is of partly trained models."
    )
  gaps = held_out_gaps(curves, runs)
  if len(gaps) >= 2:
    bullets.append(
      "The RoVE - RoPE held-out loss gap over training (mean over seed pairs, nats): "
      + ", ".join(f"step {t} {g:+.3f}" for t, g in gaps.items())
      + ": convergence speed and final quality are not told apart by one training length."
    )
  enc = next((r for r in report["runs"] if r["model"].get("n_head")), None)
  if enc and base:
    head_dim = enc["model"]["d_model"] // enc["model"]["n_head"]
    split = yarn_split(head_dim, base)
    bullets.append(
      f"YaRN with transformers' default betas (fast {YARN_BETAS[0]:g}, slow "
      f"{YARN_BETAS[1]:g}) at a {base}-token training context and head dimension "
      f"{head_dim}: of the {split['pairs']} frequency pairs it interpolates "
      f"{split['interpolated']}, ramps {split['ramped']} and keeps {split['extrapolated']} "
      f"unchanged; at the paper's 1024 tokens and head dimension 64 the split is "
      f"{_split_text(yarn_split(64, 1024))}. YaRN acts on more of the spectrum here than "
      f"in the paper."
    )
  return L + [f"- {b}" for b in bullets] + [""] if bullets else []


def _split_text(s: dict) -> str:
  return f"{s['interpolated']} / {s['ramped']} / {s['extrapolated']}"
