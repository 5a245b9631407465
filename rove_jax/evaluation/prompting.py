"""What the RULER and ICL tasks share: the tokenizer they need, the score function they call,
prompt encoding, the filler text, fitting a prompt to a token length, and answer scoring.

Both build prompts from a seed and size them in the model's own tokens. A prompt is encoded
after a leading eot_id (the training stream puts eot_id after every document, so this is how a
document starts) and its answer is encoded on its own, so the answer ids are exactly what a
greedy decoder has to produce after the prompt.

Sizing: a task builds its prompt from n units (words, lines, list entries) and `fit_length`
finds the largest n whose prompt + answer still fits the target; `within_tolerance` says whether
that n comes close enough (each task keeps its own tolerance: RULER 2%, ICL 5%).

Scoring: `score_pairs` hands (prompt ids, answer ids) pairs to the caller's ScoreFn and checks
what comes back; `mean_scores` turns the results into a mean NLL and an exact-match fraction,
`sample_records` into per-sample lists (for paired statistics across runs). `ContextFit` wraps a
ScoreFn so that every pair fits a context (the ICL rule: prompts cut from the left), counting
the prompts it cut.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Callable, NamedTuple, Protocol, Sequence

import numpy as np

# (prompt ids [P], answer ids [A]) pairs -> per pair (teacher-forced mean NLL of the answer
# tokens, greedy match: the argmax at every answer position equals the answer token).
ScoreFn = Callable[[list[np.ndarray], list[np.ndarray]], list[tuple[float, bool]]]

# The filler of the usual passkey test (Mohtashami & Jaggi, 2023), which is also RULER's noise
# haystack.
NOISE_SENTENCES = (
  "The grass is green.",
  "The sky is blue.",
  "The sun is yellow.",
  "Here we go.",
  "There and back again.",
)


class Tokenizer(Protocol):
  """What the tasks need from a tokenizer (rove_jax.data.tokenization's tokenizers qualify)."""

  eot_id: int

  def encode(self, text: str) -> np.ndarray:
    """Returns int32 ids [N] of text, without special tokens."""

  def decode(self, ids) -> str:
    """Returns the text of ids."""


# ------------------------------------------------------------------------------- checks


def check_int(name: str, value, minimum: int) -> None:
  """Raises ValueError naming `name` unless value is an int (not a bool) >= minimum."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")


def check_tokenizer(tokenizer) -> None:
  """Raises ValueError listing what `tokenizer` lacks of the Tokenizer protocol."""
  missing = [a for a in ("encode", "decode", "eot_id") if not hasattr(tokenizer, a)]
  if missing:
    raise ValueError(
      f"tokenizer lacks {missing}; it needs encode(str) -> int32 ids, decode(ids) -> str and eot_id"
    )


def read_json(path):
  """The object in a JSON file; invalid JSON is a ValueError naming the file and line."""
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as err:
      raise ValueError(f"{path}, line {err.lineno}: invalid JSON ({err.msg})") from None


# ------------------------------------------------------------------------------- encoding


def encode(tokenizer: Tokenizer, text: str) -> np.ndarray:
  """The ids of text as int32 [N].

  Args:
    tokenizer: any Tokenizer.
    text: the text.

  Returns:
    int32 ids [N]; a tokenizer returning anything but a 1-D array is an error.
  """
  ids = np.asarray(tokenizer.encode(text))
  if ids.ndim != 1:
    raise ValueError(f"tokenizer.encode must return a 1-D id array, got shape {ids.shape}")
  return ids.astype(np.int32)


def encode_prompt(tokenizer: Tokenizer, text: str) -> np.ndarray:
  """eot_id followed by the text's tokens, as int32 [1 + N] (the start of a document)."""
  return np.concatenate([np.array([tokenizer.eot_id], np.int32), encode(tokenizer, text)])


def count_tokens(tokenizer: Tokenizer, prompt: str, answer: str) -> int:
  """Tokens of a sample: the leading eot_id, the prompt and the answer, encoded separately."""
  return 1 + len(tokenizer.encode(prompt)) + len(tokenizer.encode(answer))


# ------------------------------------------------------------------------------- sizing


class LengthError(ValueError):
  """No number of units brings the sample to the target length."""


class Fit(NamedTuple):
  """What `fit_length` found.

  Attributes:
    n: the largest number of units that fits.
    tokens: size(n), at most the target.
    next_tokens: size(n + 1), over the target; inf where the material ran out or where n + 1 is
      the given upper end, which is never measured.
  """

  n: int
  tokens: float
  next_tokens: float


def fit_length(size: Callable[[int], float], target: int, *, lo: int, hi: int | None = None) -> Fit:
  """The largest n >= lo with size(n) <= target, for a size that grows with n.

  Without hi, the bracket is found by extrapolating from the measured tokens per unit (5% long,
  so that the step usually overshoots once and the bracket closes fast, and at most ~5x the
  units so far per step, so a flat start never builds a giant prompt). The bracket then shrinks
  by interpolation, which lands near the answer when the size is close to linear in n, with
  every other step a bisection so that a bend cannot stall it. Each n is measured at most once.

  Args:
    size: n -> tokens of the sample built from n units; math.inf where the material runs out.
    target: the most tokens allowed.
    lo: the smallest n; size(lo) must fit.
    hi: an n known not to fit; it is never measured, and the search is a plain bisection until
      a measured n overshoots. None: search for one.

  Returns:
    A `Fit`.

  Raises:
    LengthError: size(lo) > target, or a size that stops growing long before the target.
  """
  cache: dict = {}

  def measure(n: int) -> float:
    if n not in cache:
      cache[n] = size(n)
    return cache[n]

  f_lo = measure(lo)
  if f_lo > target:
    raise LengthError(
      f"the shortest example has {f_lo} tokens, more than the target length "
      f"{target}; ask for a length of at least {f_lo}"
    )
  if hi is None:
    start, step = lo, 16
    while True:
      hi = lo + step
      f_hi = measure(hi)
      if f_hi > target:
        break
      if hi - start > 64 * target:
        raise LengthError(
          f"cannot reach {target} tokens: {hi - start} more units still fit "
          f"(does the tokenizer encode anything?)"
        )
      slope = (f_hi - f_lo) / step
      lo, f_lo = hi, f_hi
      guess = math.ceil((target - f_lo) / slope * 1.05) if slope > 0 else 2 * step
      step = max(1, min(guess, 4 * (lo - start + 16)))
  else:
    f_hi = math.inf
  # Invariant: size(lo) <= target < size(hi).
  turn = 0
  while hi - lo > 1:
    if turn % 2 == 0 and math.isfinite(f_hi) and f_hi > f_lo:
      mid = lo + int((target - f_lo) * (hi - lo) / (f_hi - f_lo))
      mid = min(max(mid, lo + 1), hi - 1)
    else:
      mid = (lo + hi) // 2
    turn += 1
    f_mid = measure(mid)
    if f_mid <= target:
      lo, f_lo = mid, f_mid
    else:
      hi, f_hi = mid, f_mid
  return Fit(lo, f_lo, f_hi)


def within_tolerance(tokens: float, target: int, tolerance: float) -> bool:
  """True when tokens lies in [(1 - tolerance) * target, target]."""
  return tokens <= target and target - tokens <= tolerance * target


# ------------------------------------------------------------------------------- scoring


def score_pairs(
  score_fn: ScoreFn, prompts: Sequence[np.ndarray], answers: Sequence[np.ndarray], where: str = ""
) -> list[tuple[float, bool]]:
  """Scores prompt/answer pairs in one score_fn call.

  Args:
    score_fn: see ScoreFn.
    prompts: int32 prompt ids, one [P_i] array a pair.
    answers: int32 answer ids, one [A_i] array a pair.
    where: what the pairs are, for the error message (e.g. " of task 'vt' at length 512").

  Returns:
    [(mean NLL as float, greedy match as bool)], one a pair, in order.
  """
  results = list(score_fn(list(prompts), list(answers)))
  if len(results) != len(prompts):
    raise ValueError(
      f"score_fn returned {len(results)} results for {len(prompts)} pairs"
      f"{where}; it must return one (mean_nll, greedy_match) per pair"
    )
  return [(float(nll), bool(match)) for nll, match in results]


def mean_scores(results: Sequence[tuple[float, bool]]) -> tuple[float, float]:
  """(mean NLL, exact-match fraction) of `score_pairs` results."""
  return (
    float(np.mean([nll for nll, _ in results])),
    float(np.mean([match for _, match in results])),
  )


SIGNIFICANT_DIGITS = 6  # of the per-unit NLLs in a report


def round_sig(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
  """x to `digits` significant digits (keeps report.json small; exact enough for statistics)."""
  return float(f"{x:.{digits}g}")


def sample_records(results: Sequence[tuple[float, bool]]) -> dict:
  """Per-sample records of `score_pairs` results, in order: {"sample_nll": [mean answer NLL,
  SIGNIFICANT_DIGITS digits], "sample_correct": [1 for a greedy exact match, else 0]}."""
  return {
    "sample_nll": [round_sig(nll) for nll, _ in results],
    "sample_correct": [int(match) for _, match in results],
  }


class ContextFit:
  """A ScoreFn that cuts each prompt from the left so that prompt + answer fits `max_tokens`.

  Left truncation keeps the question and the nearest shots (LLM-Foundry's rule); the cut
  prompt loses its leading eot_id. Used for every encoding alike, so that all are scored on
  the same tokens.

  Attributes:
    prompts: pairs scored so far.
    truncated: pairs whose prompt was cut.
  """

  def __init__(self, score_fn: ScoreFn, max_tokens: int):
    check_int("max_tokens", max_tokens, 2)
    self.score_fn, self.max_tokens = score_fn, max_tokens
    self.prompts = self.truncated = 0

  def __call__(self, prompts: Sequence[np.ndarray], answers: Sequence[np.ndarray]):
    cut = []
    for prompt, answer in zip(prompts, answers):
      room = self.max_tokens - len(answer)
      if room < 1:
        raise ValueError(
          f"an answer of {len(answer)} tokens leaves no room for a prompt in a "
          f"context of {self.max_tokens} tokens"
        )
      if len(prompt) > room:
        prompt = prompt[len(prompt) - room :]
        self.truncated += 1
      cut.append(prompt)
    self.prompts += len(cut)
    return self.score_fn(cut, list(answers))
