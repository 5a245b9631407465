"""RULER long-context retrieval tasks (Hsieh et al. 2024), generated offline at a target length.

Every sample is built from a seed and sized in the model's own tokens, so the same call gives
the same ids on every machine and the length axis means what the model actually sees.

Tasks (RULER's names and defaults; "word" keys are adjective-noun pairs, numbers have 7 digits):
  niah_single_1    noise haystack ("The grass is green. ..."), one needle, word key, number
  niah_single_2    essay haystack (caller's texts), one needle, word key, number
  niah_single_3    essay haystack, one needle, word key, uuid value
  niah_multikey_1  essay haystack, the queried needle plus 3 needles with other keys
  niah_multikey_2  haystack made only of needles (word keys, numbers), one of them queried
  niah_multikey_3  haystack made only of needles with uuid keys and uuid values
  niah_multivalue  essay haystack, one key with 4 values (all of them are the answer)
  niah_multiquery  essay haystack, 4 keys asked at once (answer: their values in that order)
  vt               variable tracking: one chain of 4 hops "VAR B = VAR A" in noise lines
  cwe              common words: numbered list, 10 words repeated often, the rest rarely
  fwe              frequent words: coded words with Zipf(2) counts; the 3 most frequent
  qa_1, qa_2       SQuAD / HotpotQA question with its gold documents among distractor documents
                   (only from local dev files the caller passes in)

Prompt layout, encoded as one string after a leading eot_id:
  [eot] instruction, context, question, " Answer:" and an answer prefix | answer
The training stream puts eot_id after every document, so a prompt that starts with it starts
where every training document starts. The answer begins with the space the model should emit
right after the prefix (" 1234567"), and prompt and answer are encoded separately, so the
answer ids are exactly what a greedy decoder has to produce.

Sizing: `length` counts prompt + answer tokens. The haystack is a stream of segments
(sentences, lines, documents) cut after a whole number of words, the way RULER cuts its essay
haystack (cwe and fwe grow by list entries and words instead); the cut is found by
interpolation/bisection on the token count from the caller's tokenizer, with a last step inside
the next word (or, for cwe, a choice of a shorter extra word) when one unit is coarser than the
tolerance. The result lies in [0.98 * length, length]: a length equal to the model's context
always fits. Needles are only inserted between whole segments, so the one truncated segment, if
any, always ends the haystack.

Departures from RULER: no one-shot example before vt/cwe/fwe (it would not fit the short
byte-level lengths and would change the format along a length sweep); a single needle is asked
with "What is ... is" rather than "What are all ... are"; cwe repeats each common/rare word
30/3 times (RULER's setting, from 4096 tokens up) or 6/1 (RULER's short setting), and takes
the first of 30/3, 6/1, 3/1, 2/1 whose common words fill at most 3/4 of the length, so short
byte-level prompts still hold rare words to count against.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
import numbers
import os
import re
import string
import uuid
import zlib
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
         "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery",
         "vt", "cwe", "fwe")
QA_TASKS = ("qa_1", "qa_2")
# The prompt + answer may fall short of `length` by at most this fraction, never exceed it.
TOLERANCE = 0.02

ScoreFn = Callable[[list[np.ndarray], list[np.ndarray]], list[tuple[float, bool]]]


class Tokenizer(Protocol):
  """What this module needs from a tokenizer (rove_jax.tokenization tokenizers qualify)."""

  eot_id: int

  def encode(self, text: str) -> np.ndarray:
    """Returns int32 ids [N] of text, without special tokens."""

  def decode(self, ids) -> str:
    """Returns the text of ids."""


@dataclasses.dataclass
class Sample:
  """One RULER sample.

  Attributes:
    task: task name.
    length: target size in tokens (prompt + answer).
    prompt_ids: int32 [P], eot_id then everything up to and including the answer prefix.
    answer_ids: int32 [A], the gold answer, starting with the space expected after the prefix.
    answers: the gold items (values, variable names, words, or a QA question's accepted
      answers; answer_ids encodes the first QA answer).
    meta: how the sample was built: answer_text, seed, tokens (P + A), keys, depths, counts.
  """

  task: str
  length: int
  prompt_ids: np.ndarray
  answer_ids: np.ndarray
  answers: list[str]
  meta: dict


# ------------------------------------------------------------------------------- text material

_NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
          "There and back again.")

_ADJECTIVES = tuple("""
able active agile amber ancient angry autumn brave bright brisk broad calm careful cheerful
clever cloudy cold cosmic crimson crisp curious dark eager early earnest electric elegant empty
fair faithful famous fancy fast fierce fine fluffy fond fragile free fresh friendly gentle giant
glad golden graceful grand green happy hardy heavy hidden hollow honest humble hungry icy jolly
keen kind large lazy light little lively lonely loud lucky lunar magic mellow merry mighty misty
modern narrow neat nervous noble odd old orange pale patient plain polite proud purple quick
quiet rapid rare ready red rich rough round royal rusty sacred scarlet secret sharp shiny short
silent silver simple sleepy slow small smooth soft solar solid spare steady stormy strange strong
sudden sunny sweet swift tall tame tender thick tidy tiny tough tranquil true velvet vivid warm
wary wild windy wise witty wooden young zealous""".split())

_NOUNS = tuple("""
acorn anchor apple arrow badge bakery balloon banana basket beacon bear bell bicycle blanket boat
bottle bracelet bridge bucket butterfly cabin cactus camera candle canyon carpet castle cat
cathedral cello chair cherry chimney circus cliff clock cloud comet compass cookie coral cottage
crayon crown crystal cup curtain daisy desert diamond dolphin donkey dragon drum eagle engine
falcon feather fence ferry fiddle flag flute forest fountain fox galaxy garden gate glacier goat
guitar hammer harbor harp hat hawk helmet hill horse island jacket jewel kettle kite ladder lagoon
lamp lantern lemon library lighthouse lion lizard locket magnet mango maple marble meadow mirror
monkey moon mountain mushroom needle nest ocean octopus orchard otter owl paddle palace panda
parrot pebble pencil penguin piano pillow pine planet pocket pond puzzle quilt rabbit raccoon
radio rainbow raven ribbon river robot rocket saddle sailboat salmon satellite scarf shell ship
shovel spider squirrel stable star statue stone sunflower swan sword table teapot telescope
temple tiger tomato tower tractor train trumpet tulip tunnel turtle umbrella valley vase violin
volcano wagon walrus waterfall whale whistle window wizard wolf zebra""".split())

_VERBS = tuple("""
accept admire arrive bake balance borrow breathe build carry catch celebrate change climb collect
cook count cover dance decide deliver design dig discover dream drift explore fetch fix float fold
follow gather glide grow guard help hide hike hop hunt imagine invent jump juggle kick knit laugh
lead learn lift listen march mend mix move navigate observe open paint pass plant play polish pour
pull push question race reach read remember repair rescue ride roll row run sail scatter search
sew shine sing sketch skip sleep slide smile sort speak spin stack steer stretch swim swing talk
teach throw travel trust turn visit walk wander wash watch weave whisper win wink write yawn
""".split())

# cwe draws single words first; only very long lists also use adjective-noun pairs.
_SINGLE_WORDS = tuple(dict.fromkeys(_ADJECTIVES + _NOUNS + _VERBS))

_NIAH_INSTRUCTION = ("Some special magic {kind}s are hidden within the following text. Make sure "
                     "to memorize it. I will quiz you about the {kind}s afterwards.\n")
_VT_INSTRUCTION = ("Memorize and track the chain(s) of variable assignment hidden in the "
                   "following text.\n\n")
_CWE_INSTRUCTION = ("Below is a numbered list of words. In these words, some appear more often "
                    "than others. Memorize the ones that appear most often.\n")
_FWE_INSTRUCTION = ("Read the following coded text and track the frequency of each coded word. "
                    "Find the three most frequently appeared coded words. ")
_QA_INSTRUCTION = ("Answer the question based on the given documents. Only give me the answer "
                   "and do not output any other words.")

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
_FWE_WEIGHTS = 1.0 / ((math.pi ** 2 / 6) * np.arange(1, _FWE_VOCAB + 1, dtype=np.float64) ** 2)


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
class _NiahSpec:
  haystack: str  # "noise" | "essay" | "needle"
  key: str  # "word" | "uuid"
  value: str  # "number" | "uuid"
  num_keys: int = 1  # needles with distinct keys; the first num_queries of them are asked
  num_values: int = 1  # needles (values) for the first key
  num_queries: int = 1


_NIAH = {
    "niah_single_1": _NiahSpec("noise", "word", "number"),
    "niah_single_2": _NiahSpec("essay", "word", "number"),
    "niah_single_3": _NiahSpec("essay", "word", "uuid"),
    "niah_multikey_1": _NiahSpec("essay", "word", "number", num_keys=4),
    "niah_multikey_2": _NiahSpec("needle", "word", "number"),
    "niah_multikey_3": _NiahSpec("needle", "uuid", "uuid"),
    "niah_multivalue": _NiahSpec("essay", "word", "number", num_values=4),
    "niah_multiquery": _NiahSpec("essay", "word", "number", num_keys=4, num_queries=4),
}


# ------------------------------------------------------------------------------- public API


def generate(task: str, *, length: int, tokenizer: Tokenizer, seed: int,
             haystack_texts: Optional[Sequence[str]] = None, squad_path=None,
             hotpot_path=None) -> Sample:
  """Builds one RULER sample whose prompt + answer fill `length` tokens of `tokenizer`.

  Args:
    task: one of TASKS or QA_TASKS.
    length: target prompt + answer size in tokens; the sample lands in
      [(1 - TOLERANCE) * length, length].
    tokenizer: encode(str) -> int32 ids, decode(ids) -> str, eot_id.
    seed: non-negative int; the same seed gives identical ids, keys, values and depths.
    haystack_texts: essay-style documents for niah_single_2/3, niah_multikey_1,
      niah_multivalue and niah_multiquery (split into sentences and cycled from a seeded start).
    squad_path: a SQuAD JSON file (v1.1 or v2.0 dev format), needed by qa_1.
    hotpot_path: a HotpotQA JSON file (distractor dev format), needed by qa_2.

  Returns:
    A `Sample`: prompt_ids [P] and answer_ids [A] int32 with P + A <= length.

  Raises:
    ValueError: unknown task, bad arguments, missing or malformed inputs, or a length too short
      for the task's fixed parts (the message gives the minimum).
  """
  _check_task(task)
  _check_int("length", length, 1)
  _check_int("seed", seed, 0)
  _check_tokenizer(tokenizer)
  if task in _NIAH:
    candidates = [functools.partial(_niah_problem, task, _NIAH[task], seed, haystack_texts)]
  elif task == "vt":
    candidates = [functools.partial(_vt_problem, task, seed)]
  elif task == "cwe":
    freqs = _CWE_FREQS if length >= _CWE_LONG_FROM else _CWE_FREQS[1:]
    candidates = [functools.partial(_cwe_problem, task, seed, fc, fr) for fc, fr in freqs]
  elif task == "fwe":
    candidates = [functools.partial(_fwe_problem, task, seed)]
  else:
    candidates = _qa_candidates(task, seed, squad_path if task == "qa_1" else hotpot_path)
  measure = functools.partial(_count_tokens, tokenizer)
  problem, smallest = None, math.inf
  for make in candidates:
    p = make()
    p_min = measure(p.build(p.n_min, 0))
    smallest = min(smallest, p_min)
    # cwe: the first frequency setting whose common words leave room for rare ones; qa: the
    # first question (in seeded order) whose gold documents fit.
    room = _CWE_ROOM * length if task == "cwe" and make is not candidates[-1] else length
    if p_min <= room:
      problem = p
      break
  if problem is None:
    raise ValueError(
        f"length={length} is too short for task {task!r}: its fixed parts (instruction, "
        f"needles, gold documents or repeated words, question and answer) take {smallest} "
        f"tokens with this tokenizer; use length >= {smallest}")
  built, total = _fit(problem, length, measure, task)
  prompt_ids = np.concatenate([np.array([tokenizer.eot_id], np.int32), _encode(tokenizer,
                                                                                 built.prompt)])
  answer_ids = _encode(tokenizer, built.answer)
  if answer_ids.size == 0:
    raise ValueError(f"tokenizer encoded the answer {built.answer!r} of task {task!r} to no ids")
  meta = dict(built.meta, answer_text=built.answer, seed=seed, tokens=total)
  return Sample(task=task, length=length, prompt_ids=prompt_ids, answer_ids=answer_ids,
                answers=list(built.answers), meta=meta)


def evaluate(score_fn: ScoreFn, tokenizer: Tokenizer, *, tasks: Sequence[str],
             lengths: Sequence[int], samples_per_task: int, seed: int,
             haystack_texts: Optional[Sequence[str]] = None, squad_path=None, hotpot_path=None,
             progress: bool = True) -> dict:
  """Scores a model on RULER tasks at several lengths.

  Sample i of a task uses the same derived seed at every length (same keys, values and depth
  draws), so a length sweep compares like with like.

  Args:
    score_fn: (prompts, answers) -> [(mean answer NLL, teacher forced; greedy exact match of
      all answer tokens)], called once per (task, length) with samples_per_task int32 arrays.
    tokenizer: as in `generate`.
    tasks: names from TASKS and QA_TASKS.
    lengths: target sizes in tokens.
    samples_per_task: samples per (task, length).
    seed: base seed of the samples.
    haystack_texts, squad_path, hotpot_path: as in `generate`; tasks whose input is not given
      are skipped (with the reason) instead of failing.
    progress: show a tqdm bar.

  Returns:
    {"tasks": {task: {str(length): {"nll": mean, "exact_match": fraction, "n": count}}},
     "skipped": {task: reason}}.

  Raises:
    ValueError: unknown task names (the message lists the valid ones), a length too short for
      a task (raised before any score_fn call), or a score_fn returning the wrong count.
  """
  if isinstance(tasks, str):
    raise ValueError(f"tasks must be a list of task names, got the string {tasks!r}; "
                     f"write tasks=[{tasks!r}]")
  tasks = list(dict.fromkeys(tasks))
  unknown = [t for t in tasks if t not in TASKS + QA_TASKS]
  if unknown:
    raise ValueError(f"unknown RULER task(s) {unknown}; valid tasks: {list(TASKS + QA_TASKS)}")
  lengths = list(dict.fromkeys(lengths))
  for i, length in enumerate(lengths):
    _check_int(f"lengths[{i}]", length, 1)
  _check_int("samples_per_task", samples_per_task, 1)
  _check_int("seed", seed, 0)
  inputs = dict(haystack_texts=haystack_texts, squad_path=squad_path, hotpot_path=hotpot_path)
  skipped = {t: r for t in tasks if (r := _skip_reason(t, **inputs))}
  run = [t for t in tasks if t not in skipped]
  seeds = [_sample_seed(seed, i) for i in range(samples_per_task)]
  # The first sample of every (task, length) is built before any scoring, so a length that is
  # too short or a malformed file fails in seconds, not after hours of model time.
  first = {(t, n): generate(t, length=n, tokenizer=tokenizer, seed=seeds[0], **inputs)
           for t in run for n in lengths}
  from tqdm.auto import tqdm  # imported here: generate() alone needs nothing beyond numpy

  results = {}
  with tqdm(total=len(first) * samples_per_task, desc="RULER", unit="sample",
            disable=not progress) as bar:
    for t in run:
      for n in lengths:
        bar.set_postfix_str(f"{t} @ {n}")
        samples = [first.pop((t, n))] + [
            generate(t, length=n, tokenizer=tokenizer, seed=s, **inputs) for s in seeds[1:]]
        scores = list(score_fn([s.prompt_ids for s in samples], [s.answer_ids for s in samples]))
        if len(scores) != len(samples):
          raise ValueError(f"score_fn returned {len(scores)} scores for {len(samples)} samples "
                           f"of task {t!r} at length {n}; it must return one (nll, match) each")
        results.setdefault(t, {})[str(n)] = {
            "nll": float(np.mean([float(nll) for nll, _ in scores])),
            "exact_match": float(np.mean([bool(match) for _, match in scores])),
            "n": len(samples)}
        bar.update(len(samples))
  return {"tasks": results, "skipped": skipped}


@dataclasses.dataclass(frozen=True)
class QAQuestion:
  """A question, its accepted answers, and the indices of its gold documents."""

  question: str
  answers: tuple[str, ...]
  gold: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class QAData:
  """Documents (deduplicated) and answerable questions of a QA file."""

  docs: tuple[str, ...]
  questions: tuple[QAQuestion, ...]


def load_squad(path) -> QAData:
  """Reads a SQuAD v1.1/v2.0 JSON file ({"data": [{"paragraphs": [{"context", "qas"}]}]}).

  Each distinct paragraph is a document; unanswerable (v2) questions are dropped.

  Args:
    path: the JSON file.

  Returns:
    QAData with one gold document per question.
  """
  return _load_qa("squad", *_file_key(path))


def load_hotpotqa(path) -> QAData:
  """Reads a HotpotQA JSON file ([{"question", "answer", "context": [[title, [sentences]]]}]).

  Each distinct paragraph "title\\nsentences" is a document; a question's gold documents are
  all paragraphs of its own context (the supporting ones and HotpotQA's own distractors).

  Args:
    path: the JSON file.

  Returns:
    QAData.
  """
  return _load_qa("hotpot", *_file_key(path))


# ------------------------------------------------------------------------------- fitting


class _Exhausted(Exception):
  """A stream ran out of material (e.g. distinct keys) before reaching the asked size."""


@dataclasses.dataclass
class _Built:
  prompt: str
  answer: str
  answers: list
  meta: dict


@dataclasses.dataclass
class _Problem:
  # build(n, c): the sample with a haystack of n units (words, rare words, ...); c > 0 refines
  # it: c characters of the next word where next_word is set, or the c-th of `alternatives`
  # choices for one extra unit.
  build: Callable[[int, int], _Built]
  n_min: int = 0
  next_word: Optional[Callable[[int], str]] = None
  alternatives: int = 0


def _encode(tokenizer, text: str) -> np.ndarray:
  ids = np.asarray(tokenizer.encode(text))
  if ids.ndim != 1:
    raise ValueError(f"tokenizer.encode must return a 1-D id array, got shape {ids.shape}")
  return ids.astype(np.int32)


def _count_tokens(tokenizer, built: _Built) -> int:
  # 1 for the leading eot_id.
  return 1 + len(tokenizer.encode(built.prompt)) + len(tokenizer.encode(built.answer))


def _fit(problem: _Problem, length: int, measure, task: str) -> tuple[_Built, int]:
  """Largest haystack whose token count stays <= length; returns (built, tokens)."""
  cache: dict = {}

  def size(n: int, c: int = 0) -> float:
    if (n, c) not in cache:
      try:
        built = problem.build(n, c)
      except _Exhausted:
        cache[n, c] = (math.inf, None)
      else:
        cache[n, c] = (measure(built), built)
    return cache[n, c][0]

  lo = problem.n_min
  f_lo = size(lo)
  # Bracket: extrapolate from the measured tokens per unit, 5% long so that the step usually
  # overshoots once and the bracket closes fast.
  step = 16
  while True:
    hi = lo + step
    f_hi = size(hi)
    if f_hi > length:
      break
    slope = (f_hi - f_lo) / step
    lo, f_lo = hi, f_hi
    guess = math.ceil((length - f_lo) / slope * 1.05) if slope > 0 else 2 * step
    # At most ~5x the haystack so far per step: a flat start must not build a giant prompt.
    step = max(1, min(guess, 4 * (lo - problem.n_min + 16)))
  # Shrink with f(lo) <= length < f(hi); the count is close to linear in n, so interpolation
  # lands near the answer, and every other step bisects so that a bend cannot stall it.
  turn = 0
  while hi - lo > 1:
    if turn % 2 == 0 and math.isfinite(f_hi) and f_hi > f_lo:
      mid = lo + int((length - f_lo) * (hi - lo) / (f_hi - f_lo))
      mid = min(max(mid, lo + 1), hi - 1)
    else:
      mid = (lo + hi) // 2
    turn += 1
    f_mid = size(mid)
    if f_mid <= length:
      lo, f_lo = mid, f_mid
    else:
      hi, f_hi = mid, f_mid
  best = (lo, 0)
  try:
    next_word = problem.next_word(lo) if problem.next_word else None
  except _Exhausted:
    next_word = None
  if length - f_lo > TOLERANCE * length and next_word is not None:
    # One word is coarser than the tolerance (a uuid in bytes at a short length): cut inside
    # the next word.
    c_lo, c_hi = 0, len(next_word)
    while c_hi - c_lo > 1:
      mid = (c_lo + c_hi) // 2
      if size(lo, mid) <= length:
        c_lo = mid
      else:
        c_hi = mid
    best = (lo, c_lo)
  elif length - f_lo > TOLERANCE * length:
    # One more unit overshoots (a long cwe word at a short length): try other units instead.
    for c in range(1, problem.alternatives + 1):
      if length - TOLERANCE * length <= size(lo, c) <= length:
        best = (lo, c)
        break
  total, built = cache[best]
  if length - total > TOLERANCE * length:
    why = ("its haystack material ran out (distinct keys, words or documents); use a shorter "
           "length" if math.isinf(f_hi) else
           "the next haystack unit (a word, list entry or document header) overshoots and is "
           "coarser than the tolerance at this length; use a longer length")
    raise ValueError(f"task {task!r} cannot fill length={length} to within {TOLERANCE:.0%}: "
                     f"it reached {total} tokens; {why}")
  return built, int(total)


# ------------------------------------------------------------------------------- haystacks


class _Stream:
  """Haystack text as a lazily extended list of segments, cut after a number of words.

  Words are the " "-separated pieces of each segment, so a cut prefix joins back exactly.
  """

  def __init__(self, segment: Callable[[int], str]):
    self._segment = segment
    self._segs: list[str] = []
    self._words = [0]  # cumulative word counts

  def _extend(self, n_words: int) -> None:
    while self._words[-1] <= n_words:  # also holds the word right after the cut
      s = self._segment(len(self._segs))
      self._segs.append(s)
      self._words.append(self._words[-1] + s.count(" ") + 1)

  def prefix(self, n_words: int, n_chars: int = 0) -> tuple[list[str], Optional[str]]:
    """Returns (whole segments, the cut segment or None) holding n_words words (+ n_chars)."""
    self._extend(n_words)
    k = bisect.bisect_right(self._words, n_words) - 1
    r = n_words - self._words[k]
    if r == 0 and n_chars == 0:
      return self._segs[:k], None
    words = self._segs[k].split(" ")
    return self._segs[:k], " ".join(words[:r] + ([words[r][:n_chars]] if n_chars else []))

  def word(self, n: int) -> str:
    """The word right after the first n words."""
    self._extend(n)
    k = bisect.bisect_right(self._words, n) - 1
    return self._segs[k].split(" ")[n - self._words[k]]


def _place(segs: list[str], cut: Optional[str], depths, items: list[str]):
  """Inserts items between whole segments at fractional depths; the cut segment stays last.

  Returns:
    (pieces in order, item indices in the order they appear).
  """
  slots = [min(int(d * (len(segs) + 1)), len(segs)) for d in depths]
  # Ties keep item order, so a variable chain given in order stays in order.
  order = sorted(range(len(items)), key=lambda i: (slots[i], i))
  out, j = [], 0
  for b in range(len(segs) + 1):
    while j < len(order) and slots[order[j]] == b:
      out.append(items[order[j]])
      j += 1
    if b < len(segs):
      out.append(segs[b])
  if cut is not None:
    out.append(cut)
  return out, order


@functools.lru_cache(maxsize=4)
def _sentences(texts: tuple) -> tuple[str, ...]:
  out = []
  for t in texts:
    # Whitespace collapsed as RULER does with its essays: the haystack is one stream of prose.
    norm = " ".join(t.split())
    out.extend(s for s in re.split(r"(?<=[.!?]) ", norm) if s)
  return tuple(out)


def _essay_sentences(haystack_texts, task: str) -> tuple[str, ...]:
  if haystack_texts is None:
    raise ValueError(f"task {task!r} needs haystack_texts: a list of essay-style documents "
                     f"for the haystack (e.g. Paul Graham essays or validation documents)")
  if isinstance(haystack_texts, str):
    raise ValueError("haystack_texts must be a list of documents, got a single string; "
                     "pass [text]")
  texts = tuple(haystack_texts)
  for i, t in enumerate(texts):
    if not isinstance(t, str):
      raise ValueError(f"haystack_texts[{i}] is a {type(t).__name__}, expected str")
  sentences = _sentences(texts)
  if not sentences:
    raise ValueError("haystack_texts holds no text; pass non-empty documents")
  return sentences


def _rng(task: str, seed: int, *purpose: int) -> np.random.Generator:
  # crc32, not hash(): str hashes change between Python processes.
  return np.random.default_rng([seed, zlib.crc32(task.encode()), *purpose])


def _sample_seed(seed: int, i: int) -> int:
  return int(np.random.SeedSequence([seed, i]).generate_state(1)[0])


def _uuid(rng) -> str:
  return str(uuid.UUID(bytes=rng.bytes(16), version=4))


class _Draw:
  """Distinct keys or values of one kind: "word" (adjective-noun), "number" or "uuid"."""

  def __init__(self, kind: str, rng):
    self.kind, self.rng, self.seen = kind, rng, set()
    if kind == "word":
      self._order = rng.permutation(len(_ADJECTIVES) * len(_NOUNS))
      self._next = 0

  def __call__(self) -> str:
    while True:
      if self.kind == "word":
        if self._next >= len(self._order):
          raise _Exhausted
        j = int(self._order[self._next])
        self._next += 1
        s = f"{_ADJECTIVES[j // len(_NOUNS)]}-{_NOUNS[j % len(_NOUNS)]}"
      elif self.kind == "number":
        s = str(int(self.rng.integers(10 ** 6, 10 ** 7)))
      else:
        s = _uuid(self.rng)
      if s not in self.seen:
        self.seen.add(s)
        return s


def _join_and(items: list[str]) -> str:
  return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


# ------------------------------------------------------------------------------- tasks


def _niah_problem(task: str, spec: _NiahSpec, seed: int, haystack_texts) -> _Problem:
  keys, values = _Draw(spec.key, _rng(task, seed, 0)), _Draw(spec.value, _rng(task, seed, 1))
  kind = "number" if spec.value == "number" else "uuid"
  needle = "One of the special magic {kind}s for {key} is: {value}."
  key_list = [keys() for _ in range(spec.num_keys)]
  needles = [(k, values()) for i, k in enumerate(key_list)
             for _ in range(spec.num_values if i == 0 else 1)]
  items = [needle.format(kind=kind, key=k, value=v) for k, v in needles]
  depths = _rng(task, seed, 2).random(len(items)).tolist()
  if spec.haystack == "noise":
    stream, sep = _Stream(lambda i: _NOISE[i % len(_NOISE)]), " "
  elif spec.haystack == "essay":
    sentences = _essay_sentences(haystack_texts, task)
    start = int(_rng(task, seed, 3).integers(len(sentences)))
    stream, sep = _Stream(lambda i: sentences[(start + i) % len(sentences)]), " "
  else:
    # Drawn after the real needles from the same key/value draws, so no distractor repeats a
    # queried key or a gold value.
    stream = _Stream(lambda i: needle.format(kind=kind, key=keys(), value=values()))
    sep = "\n"
  queries = key_list[:spec.num_queries]
  query = _join_and(queries)
  if spec.num_values > 1 or spec.num_queries > 1:
    question = f"What are all the special magic {kind}s for {query} mentioned in the provided text?"
    prefix = f"The special magic {kind}s for {query} mentioned in the provided text are"
  else:
    question = f"What is the special magic {kind} for {query} mentioned in the provided text?"
    prefix = f"The special magic {kind} for {query} mentioned in the provided text is"
  head = _NIAH_INSTRUCTION.format(kind=kind)

  def build(n: int, c: int) -> _Built:
    segs, cut = stream.prefix(n, c)
    pieces, order = _place(segs, cut, depths, items)
    if spec.num_queries > 1:
      answers = [dict(needles)[q] for q in queries]
    else:  # the asked key's values in the order they appear in the context
      answers = [needles[i][1] for i in order if needles[i][0] == queries[0]]
    prompt = f"{head}{sep.join(pieces)}\n{question} Answer: {prefix}"
    meta = {"keys": queries, "needles": [list(x) for x in needles], "depths": depths,
            "haystack_segments": len(segs)}
    return _Built(prompt, " " + ", ".join(answers), answers, meta)

  return _Problem(build, 0, stream.word)


def _vt_problem(task: str, seed: int) -> _Problem:
  rng = _rng(task, seed, 0)
  letters = np.array(list(string.ascii_uppercase))
  names: list[str] = []
  while len(names) < _VT_CHAINS * (_VT_HOPS + 1):
    name = "".join(rng.choice(letters, 5))
    if name not in names:
      names.append(name)
  chains, items, depths = [], [], []
  depth_rng = _rng(task, seed, 1)
  for c in range(_VT_CHAINS):
    chain = names[c * (_VT_HOPS + 1):(c + 1) * (_VT_HOPS + 1)]
    value = str(int(rng.integers(10000, 100000)))
    while value in [v for _, v in chains]:  # each chain holds its own value
      value = str(int(rng.integers(10000, 100000)))
    chains.append((chain, value))
    items += [f"VAR {chain[0]} = {value}"] + [f"VAR {chain[j + 1]} = VAR {chain[j]}"
                                              for j in range(_VT_HOPS)]
    # Sorted within a chain: each assignment comes after the one it copies.
    depths += sorted(depth_rng.random(_VT_HOPS + 1).tolist())
  block = " ".join(_NOISE)
  stream = _Stream(lambda i: block)
  chain, value = chains[0]
  question = f"Question: Find all variables that are assigned the value {value} in the text above."
  prefix = (f"According to the chain(s) of variable assignment in the text above, {len(chain)} "
            f"variables are assigned the value {value}, they are:")

  def build(n: int, c: int) -> _Built:
    segs, cut = stream.prefix(n, c)
    context = "\n".join(_place(segs, cut, depths, items)[0])
    prompt = f"{_VT_INSTRUCTION}{context}\n{question} Answer: {prefix}"
    meta = {"value": value, "chains": [list(ch) for ch, _ in chains], "depths": depths}
    return _Built(prompt, " " + " ".join(chain), list(chain), meta)

  return _Problem(build, 0, stream.word)


def _cwe_problem(task: str, seed: int, freq_common: int, freq_rare: int) -> _Problem:
  rng = _rng(task, seed, 0)
  singles = [_SINGLE_WORDS[i] for i in rng.permutation(len(_SINGLE_WORDS))]
  common, rare_singles = singles[:_CWE_COMMON], singles[_CWE_COMMON:]
  pairs = rng.permutation(len(_ADJECTIVES) * len(_NOUNS))

  def rare(k: int) -> list[str]:
    if k > len(rare_singles) + len(pairs):
      raise _Exhausted
    extra = [f"{_ADJECTIVES[j // len(_NOUNS)]}-{_NOUNS[j % len(_NOUNS)]}"
             for j in pairs[:max(0, k - len(rare_singles))]]
    return rare_singles[:k] + extra

  question = f"Question: What are the {_CWE_COMMON} most common words in the above list?"
  prefix = f"The top {_CWE_COMMON} words that appear most often in the list are:"

  def build(k: int, c: int) -> _Built:
    # c > 0: one more rare word, the c-th one after the first k, to close a gap that the
    # (k+1)-th word overshoots.
    rares = rare(k) if c == 0 else rare(k) + rare(k + c)[-1:]
    words = common * freq_common + rares * freq_rare
    order = _rng(task, seed, 1000 + len(rares), c).permutation(len(words))
    listed = [words[i] for i in order]
    context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))
    # All common words tie, so the gold order is the order of first appearance: the order a
    # reader of the list meets them.
    first = {}
    for w in listed:
      first.setdefault(w, len(first))
    answers = sorted(common, key=first.__getitem__)
    prompt = f"{_CWE_INSTRUCTION}{context}\n{question} Answer: {prefix}"
    meta = {"freq_common": freq_common, "freq_rare": freq_rare, "rare_words": len(rares),
            "entries": len(listed)}
    return _Built(prompt, " " + ", ".join(answers), answers, meta)

  return _Problem(build, 0, alternatives=64)


def _fwe_problem(task: str, seed: int) -> _Problem:
  rng = _rng(task, seed, 0)
  alphabet = np.array(list(string.ascii_lowercase))
  codes: dict = {}
  while len(codes) < _FWE_VOCAB - 1:
    for row in alphabet[rng.integers(0, 26, size=(_FWE_VOCAB, _FWE_WORD_LEN))]:
      codes.setdefault("".join(row), None)
  vocab = np.array([_FWE_NOISE] + list(codes)[:_FWE_VOCAB - 1], dtype=object)
  answers = [str(w) for w in vocab[1:1 + _FWE_TOP]]
  question = ("Question: Do not provide any explanation. Please ignore the dots '....'. What are "
              "the three most frequently appeared words in the above coded text?")
  prefix = "According to the coded text above, the three most frequently appeared words are:"

  def build(n: int, c: int) -> _Built:
    words = np.repeat(vocab, _fwe_counts(n))
    words = words[_rng(task, seed, 1000 + n).permutation(len(words))]
    prompt = f"{_FWE_INSTRUCTION}{' '.join(words)}\n{question} Answer: {prefix}"
    meta = {"nominal_words": n, "words": int(len(words)),
            "answer_counts": [int(x) for x in _fwe_counts(n)[1:1 + _FWE_TOP]]}
    return _Built(prompt, " " + ", ".join(answers), list(answers), meta)

  return _Problem(build, _FWE_MIN_WORDS)


def _qa_candidates(task: str, seed: int, path) -> list:
  name = "squad_path" if task == "qa_1" else "hotpot_path"
  if path is None:
    raise ValueError(f"task {task!r} needs {name}: a local "
                     f"{'SQuAD' if task == 'qa_1' else 'HotpotQA'} dev JSON file")
  data = load_squad(path) if task == "qa_1" else load_hotpotqa(path)
  rng = _rng(task, seed, 0)
  # Questions in seeded order; generate() takes the first whose gold documents fit, so a long
  # gold context at a short length moves on instead of failing the evaluation. 64 tries bound
  # the work when nothing fits.
  picks = rng.permutation(len(data.questions))[:64]
  return [functools.partial(_qa_problem, task, seed, data, int(q)) for q in picks]


def _qa_problem(task: str, seed: int, data: QAData, qi: int) -> _Problem:
  q = data.questions[qi]
  rng = _rng(task, seed, 1 + qi)
  gold = set(q.gold)
  others = [i for i in range(len(data.docs)) if i not in gold]
  perm = rng.permutation(len(others)) if others else []

  def segment(i: int) -> str:
    if not others:
      raise _Exhausted
    # Cycled when the file has fewer documents than the length needs.
    return data.docs[others[int(perm[i % len(others)])]]

  stream = _Stream(segment)
  depths = rng.random(len(q.gold)).tolist()
  gold_docs = [data.docs[i] for i in q.gold]
  tail = f"\n\n{_QA_INSTRUCTION}\n\nQuestion: {q.question} Answer:"

  def build(n: int, c: int) -> _Built:
    segs, cut = stream.prefix(n, c) if n or c else ([], None)
    pieces, _ = _place(segs, cut, depths, gold_docs)
    docs = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(pieces))
    prompt = f"{_QA_INSTRUCTION}\n\nThe following are given documents.\n\n{docs}{tail}"
    # 1-based numbers of the gold documents (distractors never repeat a gold text).
    where = [pieces.index(d) + 1 for d in gold_docs]
    meta = {"question": q.question, "question_index": qi, "gold_documents": where,
            "documents": len(pieces), "depths": depths}
    return _Built(prompt, " " + q.answers[0], list(q.answers), meta)

  return _Problem(build, 0, stream.word)


# ------------------------------------------------------------------------------- QA files


def _file_key(path):
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"QA file {path!r} does not exist")
  st = os.stat(path)
  return os.path.abspath(path), st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=4)
def _load_qa(kind: str, path: str, mtime_ns: int, size: int) -> QAData:
  # Keyed on mtime and size so an edited file is read again.
  with open(path, encoding="utf-8") as f:
    try:
      obj = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON: {e}") from None
  docs: dict[str, int] = {}
  questions = []
  try:
    if kind == "squad":
      if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        raise TypeError
      for article in obj["data"]:
        for para in article["paragraphs"]:
          di = docs.setdefault(para["context"], len(docs))
          for qa in para["qas"]:
            answers = tuple(dict.fromkeys(a["text"] for a in qa.get("answers", []) if a["text"]))
            if answers:  # SQuAD 2.0's unanswerable questions have none
              questions.append(QAQuestion(qa["question"], answers, (di,)))
    else:
      if not isinstance(obj, list):
        raise TypeError
      for ex in obj:
        gold = [docs.setdefault(f"{title}\n{''.join(sents)}", len(docs))
                for title, sents in ex["context"]]
        if str(ex["answer"]):
          questions.append(QAQuestion(ex["question"], (str(ex["answer"]),),
                                      tuple(dict.fromkeys(gold))))
  except (KeyError, TypeError, ValueError):
    form = ('{"data": [{"paragraphs": [{"context": str, "qas": [{"question": str, "answers": '
            '[{"text": str}]}]}]}]}' if kind == "squad" else
            '[{"question": str, "answer": str, "context": [[title, [sentence, ...]], ...]}]')
    raise ValueError(f"{path} is not a {'SQuAD' if kind == 'squad' else 'HotpotQA'} file; "
                     f"expected {form}") from None
  if not questions:
    raise ValueError(f"{path} holds no answerable questions")
  return QAData(tuple(docs), tuple(questions))


# ------------------------------------------------------------------------------- validation


def _check_task(task) -> None:
  if task not in TASKS + QA_TASKS:
    raise ValueError(f"unknown RULER task {task!r}; valid tasks: {list(TASKS + QA_TASKS)}")


def _check_int(name: str, value, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")


def _check_tokenizer(tokenizer) -> None:
  missing = [a for a in ("encode", "decode", "eot_id") if not hasattr(tokenizer, a)]
  if missing:
    raise ValueError(f"tokenizer lacks {missing}; it needs encode(str) -> int32 ids, "
                     f"decode(ids) -> str and eot_id")


def _skip_reason(task: str, haystack_texts, squad_path, hotpot_path) -> Optional[str]:
  if task == "qa_1" and squad_path is None:
    return "needs squad_path: a local SQuAD JSON file (e.g. dev-v2.0.json); none was given"
  if task == "qa_2" and hotpot_path is None:
    return ("needs hotpot_path: a local HotpotQA JSON file (e.g. "
            "hotpot_dev_distractor_v1.json); none was given")
  if task in _NIAH and _NIAH[task].haystack == "essay" and haystack_texts is None:
    return "needs haystack_texts: essay-style documents for the haystack; none were given"
  return None
