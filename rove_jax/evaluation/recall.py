"""Scoring a run trained on the recall source (rove_jax.tasks.recall) at 1x..16x its length.

Shape letters (legend in rove_jax): N samples, L tokens a sample, B rows a batch.

Every run is scored on the same test samples (`test_set`: N one-query samples a length, drawn
from the run's own generator spec and a test seed) in the same order, so that per-sample
results pair up across runs. A sample's result is the answer's (the target record's) NLL given
everything before it, and whether the greedy prediction at that position is the answer (exact
match: the answer is one token). The samples' first query is scored (at L = T a sample is a
training document). Settings of the rotary frequencies at test time:
  none        the training frequencies at every length
  yarn        YaRN with factor L / T at length L (none at L <= T)      (scoring.yarn_scaling)
  yarn_fixed  YaRN with one factor (default: the largest multiple, 16) at every length, 1x too
Non-rotary encodings (NoPE) have no frequencies to scale: they get the "none" records only.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rove_jax.evaluation import scoring
from rove_jax.nn import model as nn_model
from rove_jax.scaling import RopeScaling
from rove_jax.tasks import recall as recall_data
from rove_jax.tasks.recall_chars import MARKER

SETTINGS = ("none", "yarn", "yarn_fixed")
MULTIPLES = (1, 2, 4, 8, 16)


def run_spec(run: scoring.Run) -> recall_data.RecallSpec:
  """The generator spec a run was trained on (its data.path), checking its source and that its
  tokenizer maps the generator's characters to their codes (the byte tokenizer does)."""
  data = run.config.data
  if data.source != "recall":
    raise ValueError(
      f"run {run.name} was trained on the {data.source!r} source, not "
      f"'recall'; the recall evaluation needs a recall-trained run"
    )
  spec = recall_data.RecallSpec.parse(data.path)
  chars = recall_data.KEY_CHARS + recall_data.RECORD_CHARS + recall_data.FILLER_CHARS + MARKER
  ids = np.asarray(run.tokenizer.encode(chars))
  if ids.shape != (len(chars),) or not np.array_equal(ids, [ord(c) for c in chars]):
    raise ValueError(
      f"run {run.name}'s tokenizer {run.tokenizer.name} does not encode the "
      f"recall characters as their byte values; train recall runs with "
      f"data.tokenizer='bytes'"
    )
  return spec


def test_set(
  spec: recall_data.RecallSpec, lengths: Iterable[int], n: int, *, eot_id: int, seed: int = 0
) -> dict[int, recall_data.Samples]:
  """{length: `recall_data.test_samples`} for each length."""
  return {
    int(L): recall_data.test_samples(spec, int(L), n, eot_id=eot_id, seed=seed) for L in lengths
  }


def setting_scaling(
  setting: str, length: int, train_len: int, fixed_factor: float
) -> Optional[RopeScaling]:
  """The rope_scaling of a setting at one length (None: the training frequencies)."""
  if setting == "none":
    return None
  if setting == "yarn":
    return scoring.yarn_scaling(length, train_len)
  if setting == "yarn_fixed":
    return scoring.fixed_yarn_scaling(fixed_factor, train_len)
  raise ValueError(f"unknown setting {setting!r}; expected one of {SETTINGS}")


def score_tokens(
  scorer: scoring.Scorer,
  tokens_NL: np.ndarray,
  answer_index: int,
  rope_scaling: Optional[RopeScaling] = None,
) -> tuple[np.ndarray, np.ndarray]:
  """(answer NLL [N], greedy match [N]) of samples whose answer is token answer_index.

  Rows are batched up to scorer.max_tokens_per_batch tokens; a short last batch is padded with
  copies of its first row (one compiled shape a length). The programs are compiled once per
  model config and rope_scaling (see `_scores_fn`), not per run. The same numbers as
  scorer.score(tokens[:answer_index], tokens[answer_index:answer_index + 1]) one by one.
  """
  tokens_NL = np.asarray(tokens_NL, np.int32)
  n, length = tokens_NL.shape
  if not 1 <= answer_index < length:
    raise ValueError(f"answer_index={answer_index} is not a scored position of {length} tokens")
  scorer.check_length(length - 1)
  rows = max(1, min(n, scorer.max_tokens_per_batch // length))
  nll, match = [], []
  for lo in range(0, n, rows):
    batch = tokens_NL[lo : lo + rows]
    real = batch.shape[0]
    if real < rows:
      batch = np.concatenate([batch, np.repeat(batch[:1], rows - real, axis=0)])
    nll_BT, match_BT = (
      np.asarray(x)
      for x in _scores_fn(scorer.config, rope_scaling)(scorer.run.params, jnp.asarray(batch))
    )
    nll.append(nll_BT[:real, answer_index - 1])  # position t predicts token t + 1
    match.append(match_BT[:real, answer_index - 1])
  return np.concatenate(nll), np.concatenate(match)


_FNS: dict = {}


def _scores_fn(config, rope_scaling):
  """scoring.token_scores jitted for a model config (the Scorer's: its attention kernel) and a
  rope_scaling, taking the parameters as an argument: runs of one config (the seeds of an
  encoding) share the compiled programs."""
  key = (config, rope_scaling)
  if key not in _FNS:
    graphdef = nn_model.graphdef(config)
    _FNS[key] = jax.jit(
      lambda params, tokens_BW: scoring.token_scores(
        nnx.merge(graphdef, params), tokens_BW, rope_scaling
      )
    )
  return _FNS[key]


def _round(x: float) -> float:
  return float(f"{x:.6g}")


def evaluate(
  scorer: scoring.Scorer,
  samples: dict[int, recall_data.Samples],
  *,
  encoding: Optional[str] = None,
  seed: Optional[int] = None,
  settings: Sequence[str] = SETTINGS,
  fixed_factor: Optional[float] = None,
) -> list[dict]:
  """The records of one run: one per (setting, length).

  Args:
    scorer: the run's `scoring.Scorer`.
    samples: from `test_set` (the same for every run that is compared).
    encoding, seed: labels for the records (default: the run's pos_encoding and config seed).
    settings: a subset of SETTINGS; rotary settings are skipped for non-rotary encodings.
    fixed_factor: the yarn_fixed factor (default: the longest length / the training length;
      yarn_fixed is left out when it is <= 1).

  Returns:
    [{encoding, seed, setting, length, multiple, rope_scaling, n, accuracy, nll,
      sample_correct: [0/1 per sample], sample_nll: [per sample, 6 significant digits]}],
    accuracy and nll being the means of the per-sample lists, rope_scaling the setting's
    `RopeScaling.to_dict()` (None: the training frequencies).
  """
  train_len = scorer.train_len
  encoding = encoding or scorer.config.pos_encoding
  seed = scorer.run.config.seed if seed is None else seed
  if fixed_factor is None:
    fixed_factor = max(samples) / train_len
  bad = [s for s in settings if s not in SETTINGS]
  if bad:
    raise ValueError(f"unknown settings {bad}; expected some of {SETTINGS}")
  if not scorer.rotary:
    settings = [s for s in settings if s == "none"]
  if fixed_factor <= 1:  # every length within the training length: no fixed factor to apply
    settings = [s for s in settings if s != "yarn_fixed"]
  records, done = [], {}
  for setting in settings:
    for length, smp in sorted(samples.items()):
      scaling = setting_scaling(setting, length, train_len, fixed_factor)
      key = (length, scaling)
      if key not in done:  # yarn at 1x is none at 1x: scored once
        done[key] = score_tokens(scorer, smp.tokens, smp.answer_index, scaling)
      nll, match = done[key]
      records.append(
        {
          "encoding": encoding,
          "seed": seed,
          "setting": setting,
          "length": int(length),
          "multiple": length / train_len,
          "rope_scaling": None if scaling is None else scaling.to_dict(),
          "n": int(nll.size),
          "accuracy": float(np.mean(match)),
          "nll": float(np.mean(nll)),
          "sample_correct": [int(m) for m in match],
          "sample_nll": [_round(x) for x in nll],
        }
      )
  return records


def summary_table(records: Sequence[dict]) -> str:
  """A plain-text table: accuracy % / mean answer NLL per encoding and setting (rows) and
  length (columns), averaged over seeds."""
  lengths = sorted({r["length"] for r in records})
  groups: dict = {}
  for r in records:
    groups.setdefault((r["encoding"], r["setting"]), {}).setdefault(r["length"], []).append(r)
  head = f"{'encoding':<9}{'setting':<11}{'seeds':>5}  " + "".join(f"{L:>14}" for L in lengths)
  lines = [head, "-" * len(head)]
  for (enc, setting), by_len in groups.items():
    seeds = max(len(v) for v in by_len.values())
    cells = []
    for L in lengths:
      rs = by_len.get(L, [])
      cells.append(
        f"{100 * np.mean([r['accuracy'] for r in rs]):6.1f}% {np.mean([r['nll'] for r in rs]):5.2f}"
        if rs
        else f"{'-':>14}"
      )
    lines.append(f"{enc:<9}{setting:<11}{seeds:>5}  " + "".join(f"{c:>14}" for c in cells))
  return "\n".join(lines)


def pair_table(records: Sequence[dict], a: str = "rove", b: str = "rope") -> str:
  """A plain-text table of A - B accuracy per seed pair (the same seed of both encodings),
  per setting (rows) and length (columns), in percentage points: the spread a reader should
  weigh a mean difference against. "" when no seed has both encodings."""
  acc = {(r["encoding"], r["seed"], r["setting"], r["length"]): r["accuracy"] for r in records}
  seeds = sorted({s for e, s, _, _ in acc if e == a} & {s for e, s, _, _ in acc if e == b})
  lengths = sorted({L for *_, L in acc})
  settings = [s for s in SETTINGS if any(k[2] == s for k in acc)]
  if not seeds:
    return ""
  head = f"{a} - {b}, accuracy (points) per seed pair\n{'setting':<11}{'seed':>5}  " + "".join(
    f"{L:>8}" for L in lengths
  )
  lines = [head, "-" * len(head.splitlines()[1])]
  for setting in settings:
    for seed in seeds:
      cells = [
        100 * (acc[(a, seed, setting, L)] - acc[(b, seed, setting, L)])
        if (a, seed, setting, L) in acc and (b, seed, setting, L) in acc
        else None
        for L in lengths
      ]
      lines.append(
        f"{setting:<11}{seed:>5}  "
        + "".join(f"{c:>+8.0f}" if c is not None else f"{'-':>8}" for c in cells)
      )
  return "\n".join(lines)
