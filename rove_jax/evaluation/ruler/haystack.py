"""RULER's haystack machinery: word material, seeded draws, haystack streams, needle placement,
and fitting a task's sample to a target length (the implementation behind `ruler.generate`).

A task is a `Problem`: build(n, c) makes the sample with a haystack of n units, and
`fit_problem` finds the largest n that fits (with `prompting.fit_length`), then, when one unit
is coarser than the tolerance, refines inside the next word or among alternative units.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import re
import uuid
import zlib
from typing import Callable, Optional

import numpy as np

from rove_jax.evaluation import prompting

# The prompt + answer may fall short of `length` by at most this fraction, never exceed it.
TOLERANCE = 0.02

ADJECTIVES = tuple(
  """
able active agile amber ancient angry autumn brave bright brisk broad calm careful cheerful
clever cloudy cold cosmic crimson crisp curious dark eager early earnest electric elegant empty
fair faithful famous fancy fast fierce fine fluffy fond fragile free fresh friendly gentle giant
glad golden graceful grand green happy hardy heavy hidden hollow honest humble hungry icy jolly
keen kind large lazy light little lively lonely loud lucky lunar magic mellow merry mighty misty
modern narrow neat nervous noble odd old orange pale patient plain polite proud purple quick
quiet rapid rare ready red rich rough round royal rusty sacred scarlet secret sharp shiny short
silent silver simple sleepy slow small smooth soft solar solid spare steady stormy strange strong
sudden sunny sweet swift tall tame tender thick tidy tiny tough tranquil true velvet vivid warm
wary wild windy wise witty wooden young zealous""".split()
)

NOUNS = tuple(
  """
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
volcano wagon walrus waterfall whale whistle window wizard wolf zebra""".split()
)

_VERBS = tuple(
  """
accept admire arrive bake balance borrow breathe build carry catch celebrate change climb collect
cook count cover dance decide deliver design dig discover dream drift explore fetch fix float fold
follow gather glide grow guard help hide hike hop hunt imagine invent jump juggle kick knit laugh
lead learn lift listen march mend mix move navigate observe open paint pass plant play polish pour
pull push question race reach read remember repair rescue ride roll row run sail scatter search
sew shine sing sketch skip sleep slide smile sort speak spin stack steer stretch swim swing talk
teach throw travel trust turn visit walk wander wash watch weave whisper win wink write yawn
""".split()
)

# cwe draws single words first; only very long lists also use adjective-noun pairs.
SINGLE_WORDS = tuple(dict.fromkeys(ADJECTIVES + NOUNS + _VERBS))


# ------------------------------------------------------------------------------- fitting


class Exhausted(Exception):
  """A stream ran out of material (e.g. distinct keys) before reaching the asked size."""


@dataclasses.dataclass
class Built:
  prompt: str
  answer: str
  answers: list
  meta: dict


@dataclasses.dataclass
class Problem:
  # build(n, c): the sample with a haystack of n units (words, rare words, ...); c > 0 refines
  # it: c characters of the next word where next_word is set, or the c-th of `alternatives`
  # choices for one extra unit.
  build: Callable[[int, int], Built]
  n_min: int = 0
  next_word: Optional[Callable[[int], str]] = None
  alternatives: int = 0


def fit_problem(problem: Problem, length: int, tokenizer, task: str) -> tuple[Built, int]:
  """The sample with the largest haystack whose token count stays <= length.

  Args:
    problem: the task's sample builder.
    length: the target size in tokens (prompt + answer, with the leading eot_id).
    tokenizer: counts the tokens.
    task: the task's name, for errors.

  Returns:
    (the built sample, its tokens), the tokens in [(1 - TOLERANCE) * length, length].
  """
  cache: dict = {}

  def size(n: int, c: int = 0) -> float:
    if (n, c) not in cache:
      try:
        built = problem.build(n, c)
      except Exhausted:
        cache[n, c] = (math.inf, None)
      else:
        cache[n, c] = (prompting.count_tokens(tokenizer, built.prompt, built.answer), built)
    return cache[n, c][0]

  fit = prompting.fit_length(size, length, lo=problem.n_min)
  lo = fit.n
  best = (lo, 0)
  try:
    next_word = problem.next_word(lo) if problem.next_word else None
  except Exhausted:
    next_word = None
  short = not prompting.within_tolerance(fit.tokens, length, TOLERANCE)
  if short and next_word is not None:
    # One word is coarser than the tolerance (a uuid in bytes at a short length): cut inside
    # the next word (all of it overshoots, as the whole word does).
    best = (lo, prompting.fit_length(lambda c: size(lo, c), length, lo=0, hi=len(next_word)).n)
  elif short:
    # One more unit overshoots (a long cwe word at a short length): try other units instead.
    for c in range(1, problem.alternatives + 1):
      if prompting.within_tolerance(size(lo, c), length, TOLERANCE):
        best = (lo, c)
        break
  total, built = cache[best]
  if not prompting.within_tolerance(total, length, TOLERANCE):
    why = (
      "its haystack material ran out (distinct keys, words or documents); use a shorter length"
      if math.isinf(fit.next_tokens)
      else "the next haystack unit (a word, list entry or document header) overshoots and is "
      "coarser than the tolerance at this length; use a longer length"
    )
    raise ValueError(
      f"task {task!r} cannot fill length={length} to within {TOLERANCE:.0%}: "
      f"it reached {total} tokens; {why}"
    )
  return built, int(total)


# ------------------------------------------------------------------------------- haystacks


class Stream:
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


def place(segs: list[str], cut: Optional[str], depths, items: list[str]):
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


def essay_sentences(haystack_texts, task: str) -> tuple[str, ...]:
  if haystack_texts is None:
    raise ValueError(
      f"task {task!r} needs haystack_texts: a list of essay-style documents "
      f"for the haystack (e.g. Paul Graham essays or validation documents)"
    )
  if isinstance(haystack_texts, str):
    raise ValueError("haystack_texts must be a list of documents, got a single string; pass [text]")
  texts = tuple(haystack_texts)
  for i, t in enumerate(texts):
    if not isinstance(t, str):
      raise ValueError(f"haystack_texts[{i}] is a {type(t).__name__}, expected str")
  sentences = _sentences(texts)
  if not sentences:
    raise ValueError("haystack_texts holds no text; pass non-empty documents")
  return sentences


def task_rng(task: str, seed: int, *purpose: int) -> np.random.Generator:
  # crc32, not hash(): str hashes change between Python processes.
  return np.random.default_rng([seed, zlib.crc32(task.encode()), *purpose])


def _uuid(rng) -> str:
  return str(uuid.UUID(bytes=rng.bytes(16), version=4))


class Draw:
  """Distinct keys or values of one kind: "word" (adjective-noun), "number" or "uuid"."""

  def __init__(self, kind: str, rng):
    self.kind, self.rng, self.seen = kind, rng, set()
    if kind == "word":
      self._order = rng.permutation(len(ADJECTIVES) * len(NOUNS))
      self._next = 0

  def __call__(self) -> str:
    while True:
      if self.kind == "word":
        if self._next >= len(self._order):
          raise Exhausted
        j = int(self._order[self._next])
        self._next += 1
        s = f"{ADJECTIVES[j // len(NOUNS)]}-{NOUNS[j % len(NOUNS)]}"
      elif self.kind == "number":
        s = str(int(self.rng.integers(10**6, 10**7)))
      else:
        s = _uuid(self.rng)
      if s not in self.seen:
        self.seen.add(s)
        return s


def join_and(items: list[str]) -> str:
  return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]
