"""Perplexity from 0.5x to 16x the training length, with and without YaRN at inference.

Protocol (stated in the report):
  non-overlapping  the held-out tokens are cut into windows of L + 1 tokens that share one
                   token (window i = tokens[i L : i L + L + 1]); every token after the first
                   is a target exactly once; the loss is the token-weighted mean over windows
                   (capped at max_tokens targets per length).
  sliding          windows of L + 1 tokens every `stride` tokens; the first window scores all
                   its targets, later ones only their last `stride`, so again each token is a
                   target once but (except at the start) with at least L - stride tokens of
                   context.
YaRN settings (run.train_len = T, the data.seq_len the model was trained on):
  none        the model as trained.
  yarn        per length: for L > T, frequencies from scaling.yarn with factor L / T and
              original length T; at L <= T YaRN is the identity and is not recomputed.
  yarn_fixed  one factor s for every length, those <= T included (a deployed model's setting):
              s = max(evaluated lengths) / T unless given; recorded as
              protocol["yarn_fixed_factor"].
Encodings without rotary frequencies report the YaRN settings as not applicable. Loss is also
reported by position bucket inside the window (n_buckets equal slices of [0, L)).

Per-window records, for paired statistics across runs (the same windows are scored for every
run given the same tokens): row["window_nll"][i] is window i's summed target NLL (6 significant
digits) and row["window_tokens"][i] its target count, so loss = sum(window_nll) /
sum(window_tokens) up to that rounding.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from rove_jax.evaluation.prompting import round_sig

YARN_SETTINGS = {
  "off": ("none",),
  "on": ("yarn",),
  "both": ("none", "yarn"),
  "all": ("none", "yarn", "yarn_fixed"),
}
SETTINGS = ("none", "yarn", "yarn_fixed")  # every setting a report may hold, in table order


def windows(
  tokens: np.ndarray,
  length: int,
  *,
  stride: Optional[int] = None,
  max_targets: Optional[int] = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Windows [N, L + 1] of the token stream and, for each, the first target index it scores.

  Non-overlapping (stride None or L): targets of window i are positions 0..L-1. Sliding: window
  starts advance by `stride`; all but the first score only their last `stride` targets.
  """
  tokens = np.asarray(tokens)
  if length < 1:
    raise ValueError(f"length must be >= 1, got {length}")
  if tokens.size < length + 1:
    raise ValueError(
      f"{tokens.size} held-out tokens cannot fill one window of {length + 1}; "
      f"use shorter lengths or more evaluation data"
    )
  stride = length if stride is None else stride
  if not 1 <= stride <= length:
    raise ValueError(f"stride must be in [1, length={length}], got {stride}")
  starts = np.arange(0, tokens.size - length, stride)
  first = np.where(starts == 0, 0, length - stride)
  if max_targets is not None:
    scored = np.cumsum(length - first)
    keep = max(1, int(np.searchsorted(scored, max_targets, side="left")) + 1)
    starts, first = starts[:keep], first[:keep]
  idx = starts[:, None] + np.arange(length + 1)[None, :]
  return tokens[idx].astype(np.int32), first


def fixed_factor(
  lengths: Sequence[int], train_len: int, factor: Optional[float] = None
) -> Optional[float]:
  """The yarn_fixed setting's one factor: `factor` if given, else max(lengths) / train_len;
  None when that is not > 1 (no evaluated length exceeds the training length)."""
  if factor is not None:
    return float(factor)
  factor = max(lengths) / train_len
  return factor if factor > 1 else None


def evaluate(
  scorer,
  tokens: np.ndarray,
  lengths: Sequence[int],
  *,
  yarn: str = "both",
  max_tokens: int = 32768,
  stride_fraction: Optional[float] = None,
  n_buckets: int = 8,
  yarn_fixed_factor: Optional[float] = None,
  progress: bool = True,
) -> dict:
  """Perplexity at each length for each YaRN setting.

  Args:
    scorer: a rove_jax.evaluation.scoring.Scorer.
    tokens: held-out token stream.
    lengths: window lengths L (e.g. 0.5x..16x the training length).
    yarn: "off" (none), "on" (yarn), "both" (none, yarn) or "all" (none, yarn, yarn_fixed).
    max_tokens: targets scored per length and setting.
    stride_fraction: None for non-overlapping windows, else sliding with stride = L * fraction.
    n_buckets: position buckets inside the window.
    yarn_fixed_factor: the yarn_fixed setting's factor (> 1); None: max(lengths) / train_len.
    progress: show a tqdm bar.

  Returns:
    {"protocol": {...}, SETTING: {str(L): ROW} or {"not_applicable": why}} for the settings of
    `yarn`; ROW = {"loss", "ppl", "tokens", "windows", "by_position", "window_nll",
    "window_tokens"}.

  Raises:
    ValueError: an unknown `yarn`, a length the scorer cannot score, a fixed factor <= 1.
  """
  if yarn not in YARN_SETTINGS:
    raise ValueError(f"yarn must be one of {tuple(YARN_SETTINGS)}, got {yarn!r}")
  for L in lengths:
    scorer.check_length(L)
  settings = YARN_SETTINGS[yarn]
  fixed = fixed_factor(lengths, scorer.train_len, yarn_fixed_factor)
  if "yarn_fixed" in settings and fixed is not None:
    scorer.fixed_yarn_scaling(fixed)  # validates the factor before any scoring
  out = {
    "protocol": {
      "mode": "sliding" if stride_fraction else "non-overlapping",
      "stride_fraction": stride_fraction,
      "max_tokens": max_tokens,
      "train_len": scorer.train_len,
      "n_buckets": n_buckets,
      "yarn_factor": "L / train_len for L > train_len, else none",
      "yarn_fixed_factor": fixed if "yarn_fixed" in settings else None,
    }
  }
  bar = _bar(len(lengths) * len(settings), progress)
  for setting in settings:
    why = _not_applicable(scorer, setting, fixed)
    if why:
      out[setting] = {"not_applicable": why}
      continue
    rows = {}
    for L in lengths:
      if setting == "yarn_fixed":
        scaling = scorer.fixed_yarn_scaling(fixed)
      else:
        scaling = scorer.yarn_scaling(L) if setting == "yarn" else None  # None: the model's own
      rows[str(L)] = _score_length(
        scorer,
        tokens,
        L,
        scaling,
        max_tokens=max_tokens,
        stride_fraction=stride_fraction,
        n_buckets=n_buckets,
      )
      if bar is not None:
        bar.set_postfix(L=L, yarn=setting, ppl=f"{rows[str(L)]['ppl']:.2f}")
        bar.update(1)
    out[setting] = rows
  if bar is not None:
    bar.close()
  return out


def _not_applicable(scorer, setting: str, fixed: Optional[float]) -> Optional[str]:
  """Why a YaRN setting cannot be evaluated for this scorer, or None."""
  if setting == "none":
    return None
  if not scorer.rotary:
    return f"pos_encoding={scorer.config.pos_encoding!r} has no rotary frequencies to rescale"
  if setting == "yarn_fixed" and fixed is None:
    return (
      f"no evaluated length exceeds the training length {scorer.train_len}, so "
      f"max(lengths) / train_len gives no factor > 1; give --yarn-fixed-factor"
    )
  return None


def _score_length(
  scorer,
  tokens,
  L: int,
  scaling,
  *,
  max_tokens: int,
  stride_fraction: Optional[float],
  n_buckets: int,
) -> dict:
  """One (setting, length) row: the windows of L tokens scored with `scaling`."""
  stride = None if not stride_fraction else max(1, int(L * stride_fraction))
  wins, first = windows(tokens, L, stride=stride, max_targets=max_tokens)
  per_batch = max(1, scorer.max_tokens_per_batch // L)
  window_nll, window_tokens = [], []
  bucket_sum = np.zeros(n_buckets)
  bucket_cnt = np.zeros(n_buckets)
  bucket_of = np.minimum(np.arange(L) * n_buckets // L, n_buckets - 1)
  for b in range(0, len(wins), per_batch):
    batch, batch_first = wins[b : b + per_batch], first[b : b + per_batch]
    rows_real = len(batch)
    if rows_real < per_batch and len(wins) > per_batch:  # one shape: one compilation
      batch = np.concatenate([batch, np.repeat(batch[-1:], per_batch - rows_real, 0)])
      batch_first = np.concatenate([batch_first, np.full(per_batch - rows_real, L)])
    nll, _ = scorer.token_nll(batch, scaling)
    mask = np.arange(L)[None, :] >= batch_first[:, None]  # padded rows: all False
    window_nll += (nll * mask).sum(1)[:rows_real].tolist()
    window_tokens += mask.sum(1)[:rows_real].tolist()
    np.add.at(bucket_sum, bucket_of, (nll * mask).sum(0))
    np.add.at(bucket_cnt, bucket_of, mask.sum(0))
  total, count = float(np.sum(window_nll)), int(np.sum(window_tokens))
  loss = total / count
  return {
    "loss": loss,
    "ppl": math.exp(loss),
    "tokens": count,
    "windows": int(len(wins)),
    "by_position": [float(s / c) if c else None for s, c in zip(bucket_sum, bucket_cnt)],
    "window_nll": [round_sig(x) for x in window_nll],
    "window_tokens": [int(n) for n in window_tokens],
  }


def _bar(total, enabled):
  if not enabled:
    return None
  try:
    from tqdm import tqdm
  except ImportError:
    return None
  return tqdm(total=total, desc="perplexity", unit="length")
