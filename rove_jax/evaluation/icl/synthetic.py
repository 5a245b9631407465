"""In-context learning on download-free synthetic tasks (see `icl` for the score function).

Each task generates (prompt_text, answer_text) pairs from a seed; they are scored by greedy
exact match of the answer tokens.
  by length, in tokens of the given tokenizer (eot + prompt + answer: at most the target and
  at least 95% of it, so a target equal to the model's context length fits):
    associative_recall  word: number pairs, then several keys queried (the last one is scored)
    passkey             a 5-digit pass key hidden at a random depth in filler text
    induction           random words, then a prefix of the same words: continue the copy
    flip_flop           write/ignore/read instructions with bits: a read returns the last write
    dyck                brackets of four types left open: close them
  by number of shots (k examples, then the query):
    fewshot_operator    "3 @ 4 = 7" with a hidden operator (+, -, *, max, min) per sample
    fewshot_reverse     "bakomi -> imokab"
    fewshot_uppercase   "bakomi -> BAKOMI"
"""

from __future__ import annotations

import zlib
from typing import Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

from rove_jax.evaluation import prompting
from rove_jax.evaluation.icl.files import SYNTHETIC_STREAM, seeded_stream
from rove_jax.evaluation.prompting import ScoreFn, Tokenizer

LENGTH_TASKS = ("associative_recall", "passkey", "induction", "flip_flop", "dyck")
FEWSHOT_TASKS = ("fewshot_operator", "fewshot_reverse", "fewshot_uppercase")
LENGTH_TOLERANCE = 0.05
# Random draws tried per sample before a length is declared out of reach.
_FIT_ATTEMPTS = 16

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]
_FILLER = " ".join(prompting.NOISE_SENTENCES).split()
_BRACKETS = ("()", "[]", "{}", "<>")
_MAX_DYCK_DEPTH = 8
_OPERATORS = {
  "sum": lambda a, b: a + b,
  "difference": lambda a, b: a - b,
  "product": lambda a, b: a * b,
  "max": max,
  "min": min,
}
_RECALL_QUERIES = 4
_INDUCTION_ANSWER_WORDS = 4
# Flip-flop language FFL(0.8) of Liu et al. (2023): 80% ignores, writes and reads 10% each.
_FLIP_FLOP_P = {"write": 0.1, "read": 0.1, "ignore": 0.8}


def synthetic_tasks() -> tuple[str, ...]:
  """Names of the synthetic tasks: the by-length ones, then the by-shots ones."""
  return LENGTH_TASKS + FEWSHOT_TASKS


def _word(rng, syllables: int = 3) -> str:
  return "".join(_SYLLABLES[i] for i in rng.integers(len(_SYLLABLES), size=syllables))


def _distinct_words(rng, count: int, syllables: int = 3) -> list[str]:
  """count distinct pseudo-words ("bakomi"), 70^3 = 343,000 of them, so no key repeats.

  Drawn in fixed-size blocks, so the words for count are a prefix of those for count + 1: the
  length search then sees a text that grows by one word per step.
  """
  space = len(_SYLLABLES) ** syllables
  if count > space // 2:
    raise ValueError(f"{count} distinct words asked of a space of {space}; use a shorter length")
  ids, seen = [], set()
  while len(ids) < count:
    for i in rng.integers(space, size=1024).tolist():
      if i not in seen and len(ids) < count:
        seen.add(i)
        ids.append(i)
  words = []
  for i in ids:
    parts = []
    for _ in range(syllables):
      i, r = divmod(i, len(_SYLLABLES))
      parts.append(_SYLLABLES[r])
    words.append("".join(parts))
  return words


# Length builders: (rng, n units) -> (prompt, answer); a unit is a few tokens, so some n lands
# within 5% of any reachable target.


def _associative_recall(rng, n):
  # One stream each for keys, values and queries keeps the pairs of n a prefix of those of n + 1.
  key_rng, value_rng, query_rng = rng.spawn(3)
  keys = _distinct_words(key_rng, n)
  values = [f"{v:03d}" for v in value_rng.integers(1000, size=n).tolist()]
  queries = query_rng.choice(n, size=min(_RECALL_QUERIES, n), replace=False).tolist()
  lines = ["Remember the number of each word."] + [f"{k}: {v}" for k, v in zip(keys, values)]
  # The earlier queries are answered in the prompt: several retrievals in one context, and
  # the format of the scored one is shown.
  lines += ["Now recall them."] + [f"{keys[q]}: {values[q]}" for q in queries[:-1]]
  lines.append(f"{keys[queries[-1]]}:")
  return "\n".join(lines), f" {values[queries[-1]]}"


def _passkey(rng, n):
  key = int(rng.integers(10000, 100000))
  filler = [_FILLER[i % len(_FILLER)] for i in range(n)]
  # The needle goes between sentences, at the sentence end nearest a uniform random depth.
  ends = [0] + [i + 1 for i, word in enumerate(filler) if word.endswith(".")]
  aim = rng.random() * n
  depth = min(ends, key=lambda i: abs(i - aim))
  needle = f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
  text = " ".join(filler[:depth]) + needle + " ".join(filler[depth:])
  return (
    f"A pass key is hidden in the text below. Remember it.\n{text}\n"
    f"What is the pass key? The pass key is"
  ), f" {key}"


def _induction(rng, n):
  # n counts the words of both copies, so each step adds one word (BPE: a few tokens); the
  # second copy breaks off about halfway through the first.
  shown = max(1, n // 3)
  words = _distinct_words(rng, max(n - shown, shown + 1))
  answer = words[shown : shown + _INDUCTION_ANSWER_WORDS]
  return (
    f"Random words, then the same words again.\n{' '.join(words)}\n{' '.join(words[:shown])}"
  ), " " + " ".join(answer)


def _flip_flop(rng, n):
  ops = list(_FLIP_FLOP_P)
  p = np.array([_FLIP_FLOP_P[op] for op in ops])
  lines, last = ["Flip-flop: read repeats the last written bit."], None
  for step in range(max(n, 2) - 1):
    op = "write" if step == 0 else ops[int(rng.choice(len(ops), p=p))]
    bit = last if op == "read" else int(rng.integers(2))
    if op == "write":
      last = bit
    lines.append(f"{op} {bit}")
  lines.append("read")
  return "\n".join(lines), f" {last}"


def _dyck(rng, n):
  stack, symbols = [], []
  for step in range(max(n, 1)):
    # Opening is forced on an empty stack and, at the last step, on a stack of one, so at
    # least one bracket is left to close.
    must_open = not stack or (step == n - 1 and len(stack) == 1)
    if must_open or (len(stack) < _MAX_DYCK_DEPTH and rng.random() < 0.5):
      pair = _BRACKETS[int(rng.integers(len(_BRACKETS)))]
      stack.append(pair[1])
      symbols.append(pair[0])
    else:
      symbols.append(stack.pop())
  return "Close the brackets: " + " ".join(symbols), " " + " ".join(reversed(stack))


_LENGTH_BUILDERS = {
  "associative_recall": _associative_recall,
  "passkey": _passkey,
  "induction": _induction,
  "flip_flop": _flip_flop,
  "dyck": _dyck,
}


def _fit_length(build, tokenizer: Tokenizer, target: int, what: str):
  """build(n, attempt) for the largest n whose length is <= target, if that is within 5% of it.

  Never longer than the target, so a target equal to a model's context length fits it. When a
  unit is coarse next to the 5% window (a key-value pair of a short target), the largest n may
  fall short; another attempt (another random draw of the same sample) then usually fits.
  """
  closest = 0
  for attempt in range(_FIT_ATTEMPTS):

    def size(n, attempt=attempt):
      return prompting.count_tokens(tokenizer, *build(n, attempt))

    try:
      fit = prompting.fit_length(size, target, lo=1)
    except prompting.LengthError as err:
      raise ValueError(f"{what}: {err}") from None
    if prompting.within_tolerance(fit.tokens, target, LENGTH_TOLERANCE):
      return build(fit.n, attempt)
    closest = max(closest, fit.tokens)
  raise ValueError(
    f"{what}: the closest example has {closest} tokens, more than 5% below the "
    f"target length {target}; pick another length"
  )


# Few-shot builders: (rng, max_shots) -> (shot lines, query prompt, answer); the query is drawn
# first and shots one by one, so k shots are the first k of any larger draw.


def _fewshot_operator(rng, max_shots):
  names = list(_OPERATORS)
  op = _OPERATORS[names[int(rng.integers(len(names)))]]
  a, b = (int(x) for x in rng.integers(1, 10, size=2))
  shots, seen = [], {(a, b)}
  while len(shots) < max_shots:
    x, y = (int(v) for v in rng.integers(1, 10, size=2))
    # Every shot tells the operators apart (all results differ), so one shot determines it.
    if (x, y) in seen or len({f(x, y) for f in _OPERATORS.values()}) < len(_OPERATORS):
      continue
    seen.add((x, y))
    shots.append(f"{x} @ {y} = {op(x, y)}")
  return shots, f"{a} @ {b} =", f" {op(a, b)}"


def _word_mapping(transform):
  def build(rng, max_shots):
    words = []
    while len(words) < max_shots + 1:
      word = _word(rng)
      if word not in words:
        words.append(word)
    shots = [f"{w} -> {transform(w)}" for w in words[1:]]
    return shots, f"{words[0]} ->", f" {transform(words[0])}"

  return build


_FEWSHOT_BUILDERS = {
  "fewshot_operator": _fewshot_operator,
  "fewshot_reverse": _word_mapping(lambda w: w[::-1]),
  "fewshot_uppercase": _word_mapping(str.upper),
}


def _check_tasks(tasks) -> tuple[str, ...]:
  valid = synthetic_tasks()
  if tasks is None:
    return valid
  if isinstance(tasks, str):
    tasks = (tasks,)
  unknown = [t for t in tasks if t not in valid]
  if unknown:
    raise ValueError(
      f"unknown synthetic task(s) {', '.join(map(repr, unknown))}; valid names: {', '.join(valid)}"
    )
  return tuple(tasks)


def _check_counts(name: str, values, minimum: int) -> tuple[int, ...]:
  values = tuple(values)
  if not values or any(
    isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum for v in values
  ):
    raise ValueError(f"{name}={values!r} must be a non-empty sequence of ints >= {minimum}")
  return tuple(int(v) for v in values)


def synthetic_examples(
  task: str,
  tokenizer: Tokenizer,
  *,
  shots: Optional[int] = None,
  length: Optional[int] = None,
  samples: int = 16,
  seed: int = 0,
  max_shots: Optional[int] = None,
) -> list[tuple[str, str]]:
  """Generates (prompt_text, answer_text) pairs of one synthetic task, deterministically.

  Args:
    task: a name from `synthetic_tasks()`.
    tokenizer: measures lengths (by-length tasks); unused by the few-shot tasks.
    shots: number of shots, for the fewshot_* tasks.
    length: target tokens (eot + prompt + answer in [0.95 * length, length]), for the other
      tasks.
    samples: number of pairs.
    seed: the seed; each pair depends only on (seed, task, length, sample index).
    max_shots: few-shot tasks only: the shots are the first `shots` of `max_shots` drawn, which
      fixes the query of a sample across shot counts (default: shots).

  Returns:
    samples (prompt_text, answer_text) pairs; the answer starts with a space.
  """
  (task,) = _check_tasks((task,))
  prompting.check_int("samples", samples, 1)
  task_id = zlib.crc32(task.encode())
  if task in _FEWSHOT_BUILDERS:
    if shots is None or length is not None:
      raise ValueError(f"task {task!r} is evaluated by number of shots: pass shots=, not length=")
    (shots,) = _check_counts("shots", (shots,), 0)
    (max_shots,) = _check_counts("max_shots", (shots if max_shots is None else max_shots,), shots)
    pairs = []
    for i in range(samples):
      lines, query, answer = _FEWSHOT_BUILDERS[task](
        seeded_stream(seed, SYNTHETIC_STREAM, task_id, i), max_shots
      )
      pairs.append(("\n".join(lines[:shots] + [query]), answer))
    return pairs
  if length is None or shots is not None:
    raise ValueError(f"task {task!r} is evaluated by context length: pass length=, not shots=")
  (length,) = _check_counts("length", (length,), 1)

  pairs = []
  for i in range(samples):
    key = (SYNTHETIC_STREAM, task_id, length, i)
    # A fresh generator per try: the n that fits is searched for, the sample stays the same.
    build = lambda n, attempt, k=key: _LENGTH_BUILDERS[task](seeded_stream(seed, *k, attempt), n)
    pairs.append(_fit_length(build, tokenizer, length, f"task {task!r}, length {length}"))
  return pairs


def run_synthetic(
  score_fn: ScoreFn,
  tokenizer: Tokenizer,
  *,
  tasks=None,
  shots: Sequence[int] = (0, 1, 2, 4, 8),
  lengths: Sequence[int] = (256, 512, 1024),
  samples: int = 16,
  seed: int = 0,
  progress: bool = True,
) -> dict:
  """Greedy exact-match accuracy on the synthetic tasks, by shots or by length.

  Args:
    score_fn: (prompt ids, continuation ids) -> [(mean NLL, greedy match)] (prompting.ScoreFn).
    tokenizer: encodes prompts (after an eot_id) and answers separately; measures lengths.
    tasks: names from `synthetic_tasks()`, None for all.
    shots: shot counts for the fewshot_* tasks; a sample keeps its query across counts.
    lengths: target lengths in tokens for the other tasks.
    samples: pairs per (task, shots or length).
    seed: the seed; a task's results do not depend on which other tasks run.
    progress: show a tqdm bar.

  Returns:
    {"tasks": {name: {"by_shots" | "by_length": {str(k or L): accuracy},
                      "nll_by_shots" | "nll_by_length": {str(k or L): mean answer NLL},
                      "sample_nll_by_shots" | "sample_nll_by_length": {str(k or L): [per
                        sample mean answer NLL, 6 significant digits]},
                      "sample_correct_by_shots" | "sample_correct_by_length": {str(k or L):
                        [1 for a greedy exact match, else 0, per sample]},
                      "accuracy": mean over the shots or lengths,
                      "n": samples scored over all of them, "correct": their exact matches}},
     "accuracy": mean over the tasks}. Sample i of a (task, shots or length) cell is the same
    for every run given the seed, so the lists pair up across runs.
  """
  names = _check_tasks(tasks)
  prompting.check_int("seed", seed, 0)
  shots = _check_counts("shots", shots, 0)
  lengths = _check_counts("lengths", lengths, 1)
  prompting.check_int("samples", samples, 1)
  cells = [
    (name, "shots" if name in _FEWSHOT_BUILDERS else "length", value)
    for name in names
    for value in (shots if name in _FEWSHOT_BUILDERS else lengths)
  ]
  bar = tqdm(total=len(cells) * samples, desc="synthetic icl", disable=not progress, leave=False)
  out = {}
  for name, axis, value in cells:
    extra = {"max_shots": max(shots)} if axis == "shots" else {}
    pairs = synthetic_examples(
      name, tokenizer, **{axis: value}, samples=samples, seed=seed, **extra
    )
    prompts = [prompting.encode_prompt(tokenizer, prompt) for prompt, _ in pairs]
    answers = [prompting.encode(tokenizer, answer) for _, answer in pairs]
    results = prompting.score_pairs(score_fn, prompts, answers)
    task = out.setdefault(
      name,
      {
        f"by_{axis}": {},
        f"nll_by_{axis}": {},
        f"sample_nll_by_{axis}": {},
        f"sample_correct_by_{axis}": {},
      },
    )
    nll, accuracy = prompting.mean_scores(results)
    records = prompting.sample_records(results)
    task[f"by_{axis}"][str(value)] = accuracy
    task[f"nll_by_{axis}"][str(value)] = nll
    task[f"sample_nll_by_{axis}"][str(value)] = records["sample_nll"]
    task[f"sample_correct_by_{axis}"][str(value)] = records["sample_correct"]
    bar.update(samples)
  bar.close()
  for task in out.values():
    axis = "shots" if "by_shots" in task else "length"
    task["accuracy"] = float(np.mean(list(task[f"by_{axis}"].values())))
    correct = task[f"sample_correct_by_{axis}"].values()
    task["n"] = sum(len(c) for c in correct)
    task["correct"] = sum(sum(c) for c in correct)
  return {
    "tasks": out,
    "accuracy": float(np.mean([t["accuracy"] for t in out.values()])) if out else None,
  }
