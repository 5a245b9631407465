"""RULER's synthetic tasks: needle-in-a-haystack, variable tracking, common and frequent words
(the sample builders behind `ruler.generate`; the QA tasks are in ruler_qa)."""

from __future__ import annotations

import dataclasses
import functools
import math
import string
from typing import Callable

import numpy as np

from rove_jax.evaluation.prompting import NOISE_SENTENCES
from rove_jax.evaluation.ruler import qa as ruler_qa
from rove_jax.evaluation.ruler.haystack import (
  ADJECTIVES,
  NOUNS,
  SINGLE_WORDS,
  Built,
  Draw,
  Exhausted,
  Problem,
  Stream,
  essay_sentences,
  join_and,
  place,
  task_rng,
)

_NIAH_INSTRUCTION = (
  "Some special magic {kind}s are hidden within the following text. Make sure "
  "to memorize it. I will quiz you about the {kind}s afterwards.\n"
)
_VT_INSTRUCTION = (
  "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
)
_CWE_INSTRUCTION = (
  "Below is a numbered list of words. In these words, some appear more often "
  "than others. Memorize the ones that appear most often.\n"
)
_FWE_INSTRUCTION = (
  "Read the following coded text and track the frequency of each coded word. "
  "Find the three most frequently appeared coded words. "
)

_VT_CHAINS, _VT_HOPS = 1, 4
_CWE_COMMON = 10
# (repeats of each common word, repeats of each rare word), RULER's long setting first.
_CWE_FREQS = ((30, 3), (6, 1), (3, 1), (2, 1))
_CWE_LONG_FROM = 4096
# The common words may fill at most this share of the length: the rare words, which are what
# makes counting necessary, must keep a real part of the list.
_CWE_ROOM = 0.75
_FWE_VOCAB, _FWE_WORD_LEN, _FWE_TOP = 2000, 6, 3
_FWE_NOISE = "...."
# Zipf(2) frequencies 1 / (zeta(2) k^2); the rank-1 word is the "...." noise, as in RULER.
_FWE_WEIGHTS = 1.0 / ((math.pi**2 / 6) * np.arange(1, _FWE_VOCAB + 1, dtype=np.float64) ** 2)


def _fwe_counts(num_words: int) -> np.ndarray:
  return np.floor(num_words * _FWE_WEIGHTS).astype(np.int64)


def _fwe_min_words() -> int:
  """Smallest nominal word count from which ranks 2..4 always have strictly falling counts that
  beat every other coded word, so the three answers are well defined (and in a fixed order)."""
  last_bad = 0
  for n in range(1, 2000):
    c = _fwe_counts(n)
    if not (c[1] > c[2] > c[3] > c[4]):
      last_bad = n
  return last_bad + 1


_FWE_MIN_WORDS = _fwe_min_words()


@dataclasses.dataclass(frozen=True)
class NiahSpec:
  haystack: str  # "noise" | "essay" | "needle"
  key: str  # "word" | "uuid"
  value: str  # "number" | "uuid"
  num_keys: int = 1  # needles with distinct keys; the first num_queries of them are asked
  num_values: int = 1  # needles (values) for the first key
  num_queries: int = 1


NIAH = {
  "niah_single_1": NiahSpec("noise", "word", "number"),
  "niah_single_2": NiahSpec("essay", "word", "number"),
  "niah_single_3": NiahSpec("essay", "word", "uuid"),
  "niah_multikey_1": NiahSpec("essay", "word", "number", num_keys=4),
  "niah_multikey_2": NiahSpec("needle", "word", "number"),
  "niah_multikey_3": NiahSpec("needle", "uuid", "uuid"),
  "niah_multivalue": NiahSpec("essay", "word", "number", num_values=4),
  "niah_multiquery": NiahSpec("essay", "word", "number", num_keys=4, num_queries=4),
}


# ------------------------------------------------------------------------------- tasks


def _niah_problem(task: str, spec: NiahSpec, seed: int, haystack_texts) -> Problem:
  keys, values = Draw(spec.key, task_rng(task, seed, 0)), Draw(spec.value, task_rng(task, seed, 1))
  kind = "number" if spec.value == "number" else "uuid"
  needle = "One of the special magic {kind}s for {key} is: {value}."
  key_list = [keys() for _ in range(spec.num_keys)]
  needles = [
    (k, values()) for i, k in enumerate(key_list) for _ in range(spec.num_values if i == 0 else 1)
  ]
  items = [needle.format(kind=kind, key=k, value=v) for k, v in needles]
  depths = task_rng(task, seed, 2).random(len(items)).tolist()
  if spec.haystack == "noise":
    stream, sep = Stream(lambda i: NOISE_SENTENCES[i % len(NOISE_SENTENCES)]), " "
  elif spec.haystack == "essay":
    sentences = essay_sentences(haystack_texts, task)
    start = int(task_rng(task, seed, 3).integers(len(sentences)))
    stream, sep = Stream(lambda i: sentences[(start + i) % len(sentences)]), " "
  else:
    # Drawn after the real needles from the same key/value draws, so no distractor repeats a
    # queried key or a gold value.
    stream = Stream(lambda i: needle.format(kind=kind, key=keys(), value=values()))
    sep = "\n"
  queries = key_list[: spec.num_queries]
  query = join_and(queries)
  if spec.num_values > 1 or spec.num_queries > 1:
    question = f"What are all the special magic {kind}s for {query} mentioned in the provided text?"
    prefix = f"The special magic {kind}s for {query} mentioned in the provided text are"
  else:
    question = f"What is the special magic {kind} for {query} mentioned in the provided text?"
    prefix = f"The special magic {kind} for {query} mentioned in the provided text is"
  head = _NIAH_INSTRUCTION.format(kind=kind)

  def build(n: int, c: int) -> Built:
    segs, cut = stream.prefix(n, c)
    pieces, order = place(segs, cut, depths, items)
    if spec.num_queries > 1:
      answers = [dict(needles)[q] for q in queries]
    else:  # the asked key's values in the order they appear in the context
      answers = [needles[i][1] for i in order if needles[i][0] == queries[0]]
    prompt = f"{head}{sep.join(pieces)}\n{question} Answer: {prefix}"
    meta = {
      "keys": queries,
      "needles": [list(x) for x in needles],
      "depths": depths,
      "haystack_segments": len(segs),
    }
    return Built(prompt, " " + ", ".join(answers), answers, meta)

  return Problem(build, 0, stream.word)


def _vt_problem(task: str, seed: int) -> Problem:
  rng = task_rng(task, seed, 0)
  letters = np.array(list(string.ascii_uppercase))
  names: list[str] = []
  while len(names) < _VT_CHAINS * (_VT_HOPS + 1):
    name = "".join(rng.choice(letters, 5))
    if name not in names:
      names.append(name)
  chains, items, depths = [], [], []
  depth_rng = task_rng(task, seed, 1)
  for c in range(_VT_CHAINS):
    chain = names[c * (_VT_HOPS + 1) : (c + 1) * (_VT_HOPS + 1)]
    value = str(int(rng.integers(10000, 100000)))
    while value in [v for _, v in chains]:  # each chain holds its own value
      value = str(int(rng.integers(10000, 100000)))
    chains.append((chain, value))
    items += [f"VAR {chain[0]} = {value}"] + [
      f"VAR {chain[j + 1]} = VAR {chain[j]}" for j in range(_VT_HOPS)
    ]
    # Sorted within a chain: each assignment comes after the one it copies.
    depths += sorted(depth_rng.random(_VT_HOPS + 1).tolist())
  block = " ".join(NOISE_SENTENCES)
  stream = Stream(lambda i: block)
  chain, value = chains[0]
  question = f"Question: Find all variables that are assigned the value {value} in the text above."
  prefix = (
    f"According to the chain(s) of variable assignment in the text above, {len(chain)} "
    f"variables are assigned the value {value}, they are:"
  )

  def build(n: int, c: int) -> Built:
    segs, cut = stream.prefix(n, c)
    context = "\n".join(place(segs, cut, depths, items)[0])
    prompt = f"{_VT_INSTRUCTION}{context}\n{question} Answer: {prefix}"
    meta = {"value": value, "chains": [list(ch) for ch, _ in chains], "depths": depths}
    return Built(prompt, " " + " ".join(chain), list(chain), meta)

  return Problem(build, 0, stream.word)


def _cwe_problem(task: str, seed: int, freq_common: int, freq_rare: int) -> Problem:
  rng = task_rng(task, seed, 0)
  singles = [SINGLE_WORDS[i] for i in rng.permutation(len(SINGLE_WORDS))]
  common, rare_singles = singles[:_CWE_COMMON], singles[_CWE_COMMON:]
  pairs = rng.permutation(len(ADJECTIVES) * len(NOUNS))

  def rare(k: int) -> list[str]:
    if k > len(rare_singles) + len(pairs):
      raise Exhausted
    extra = [
      f"{ADJECTIVES[j // len(NOUNS)]}-{NOUNS[j % len(NOUNS)]}"
      for j in pairs[: max(0, k - len(rare_singles))]
    ]
    return rare_singles[:k] + extra

  question = f"Question: What are the {_CWE_COMMON} most common words in the above list?"
  prefix = f"The top {_CWE_COMMON} words that appear most often in the list are:"

  def build(k: int, c: int) -> Built:
    # c > 0: one more rare word, the c-th one after the first k, to close a gap that the
    # (k+1)-th word overshoots.
    rares = rare(k) if c == 0 else rare(k) + rare(k + c)[-1:]
    words = common * freq_common + rares * freq_rare
    order = task_rng(task, seed, 1000 + len(rares), c).permutation(len(words))
    listed = [words[i] for i in order]
    context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))
    # All common words tie, so the gold order is the order of first appearance: the order a
    # reader of the list meets them.
    first = {}
    for w in listed:
      first.setdefault(w, len(first))
    answers = sorted(common, key=first.__getitem__)
    prompt = f"{_CWE_INSTRUCTION}{context}\n{question} Answer: {prefix}"
    meta = {
      "freq_common": freq_common,
      "freq_rare": freq_rare,
      "rare_words": len(rares),
      "entries": len(listed),
    }
    return Built(prompt, " " + ", ".join(answers), answers, meta)

  return Problem(build, 0, alternatives=64)


def _fwe_problem(task: str, seed: int) -> Problem:
  rng = task_rng(task, seed, 0)
  alphabet = np.array(list(string.ascii_lowercase))
  codes: dict = {}
  while len(codes) < _FWE_VOCAB - 1:
    for row in alphabet[rng.integers(0, 26, size=(_FWE_VOCAB, _FWE_WORD_LEN))]:
      codes.setdefault("".join(row), None)
  vocab = np.array([_FWE_NOISE] + list(codes)[: _FWE_VOCAB - 1], dtype=object)
  answers = [str(w) for w in vocab[1 : 1 + _FWE_TOP]]
  question = (
    "Question: Do not provide any explanation. Please ignore the dots '....'. What are "
    "the three most frequently appeared words in the above coded text?"
  )
  prefix = "According to the coded text above, the three most frequently appeared words are:"

  def build(n: int, c: int) -> Built:
    words = np.repeat(vocab, _fwe_counts(n))
    words = words[task_rng(task, seed, 1000 + n).permutation(len(words))]
    prompt = f"{_FWE_INSTRUCTION}{' '.join(words)}\n{question} Answer: {prefix}"
    meta = {
      "nominal_words": n,
      "words": int(len(words)),
      "answer_counts": [int(x) for x in _fwe_counts(n)[1 : 1 + _FWE_TOP]],
    }
    return Built(prompt, " " + ", ".join(answers), list(answers), meta)

  return Problem(build, _FWE_MIN_WORDS)


def candidates(
  task: str, seed: int, length: int, haystack_texts, squad_path, hotpot_path
) -> list[tuple[Callable[[], Problem], float]]:
  """The ways to build a sample of `task`, in order of preference.

  Args:
    task: a RULER task name.
    seed: the sample's seed.
    length: the target size in tokens.
    haystack_texts, squad_path, hotpot_path: as in `ruler.generate`.

  Returns:
    [(make a Problem, the most tokens its smallest sample may take)]: `generate` takes the first
    that fits. cwe: the first frequency setting whose common words leave room for rare ones;
    qa: the first question (in seeded order) whose gold documents fit.
  """
  if task in NIAH:
    makes = [functools.partial(_niah_problem, task, NIAH[task], seed, haystack_texts)]
  elif task == "vt":
    makes = [functools.partial(_vt_problem, task, seed)]
  elif task == "cwe":
    freqs = _CWE_FREQS if length >= _CWE_LONG_FROM else _CWE_FREQS[1:]
    makes = [functools.partial(_cwe_problem, task, seed, fc, fr) for fc, fr in freqs]
  elif task == "fwe":
    makes = [functools.partial(_fwe_problem, task, seed)]
  else:
    makes = ruler_qa.qa_candidates(task, seed, squad_path if task == "qa_1" else hotpot_path)
  last = len(makes) - 1
  return [
    (make, _CWE_ROOM * length if task == "cwe" and i < last else length)
    for i, make in enumerate(makes)
  ]
