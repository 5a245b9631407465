"""In-context learning: LLM-Foundry / DCLM task files and download-free synthetic tasks.

Everything here talks to the model through one function and is pure Python + numpy:

  score_fn(prompts, continuations) -> [(mean_nll, greedy_match), ...]

prompts[i] and continuations[i] are int32 token ids; mean_nll is the teacher-forced mean negative
log-likelihood of the continuation tokens given the prompt, greedy_match is True when the argmax
prediction at every continuation position equals the continuation token. Every prompt starts with
tokenizer.eot_id: the training data puts eot after every document, so this is what the start of a
document looks like to the model, and a prompt is never empty.

Task files (one JSON object a line, the LLM-Foundry / DCLM formats; extra fields are ignored):
  multiple_choice    {"query": str, "choices": [str, ...], "gold": int}
                     Each choice is scored by its mean NLL per token (LLM-Foundry's
                     InContextLearningMultipleChoiceAccuracy picks the lowest perplexity, i.e. the
                     lowest mean cross-entropy, and DCLM reuses it); scoring="sum" ranks by the
                     summed NLL instead. Correct when the gold choice scores best (ties go to the
                     lower index).
  language_modeling  {"context": str, "continuation": str}
                     Correct when the greedy tokens equal every continuation token.
  schema             {"context_options": [str, ...], "continuation": str, "gold": int}
                     The same continuation is scored after each context option; correct when the
                     gold option gives it the lowest NLL.

Prompt layout (LLM-Foundry's): the optional prompt_string, the k shots and the query, joined by
example_delimiter (default "\\n"); a shot is its context + continuation_delimiter (default " ")
+ its gold answer. The text is split before the answer, and the trailing whitespace of
continuation_delimiter travels with the continuation (prompt "Q: 2+2 =", continuation " 4"):
prompt + continuation is exactly the joined text, and BPE tokenizers see " 4" as in running text.
Shots are k other examples of the same file, drawn without replacement from a generator seeded
with (seed, example index), so an example's shots do not depend on which others are evaluated.

Task specs: a JSON file holding a list of objects (or {"icl_tasks": [...]}, as in LLM-Foundry's
YAML), one a task:
  {"name": "hellaswag", "path": "hellaswag.jsonl", "kind": "multiple_choice",
   "num_fewshot": 10, "baseline": 0.25,
   "example_delimiter": "\\n", "continuation_delimiter": " ", "prompt_string": "",
   "scoring": "mean"}
Only name, path and kind are required. LLM-Foundry's names are accepted too (label,
dataset_uri, icl_task_type, random_baseline; num_fewshot may be a one-element list). A relative
path is taken from the spec file's folder. baseline is the random-guess accuracy as a fraction;
left out, it is the mean of 1 / (number of options) over the file (0 for language_modeling).

Scores: centered accuracy (acc - baseline) / (1 - baseline) is 0 at chance and 1 when perfect;
DCLM's "Core" is its mean over the tasks evaluated (22 tasks in DCLM).

Synthetic tasks (no downloads; generated from a seed as (prompt_text, answer_text) pairs and
scored by greedy exact match of the answer tokens):
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

import dataclasses
import json
import os
import zlib
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np
from tqdm.auto import tqdm


class Tokenizer(Protocol):
  """What this module needs from a tokenizer (rove_jax.tokenization's tokenizers qualify)."""

  eot_id: int

  def encode(self, text: str) -> np.ndarray:
    ...

  def decode(self, ids) -> str:
    ...


# (prompt ids, continuation ids) -> per pair (mean NLL of the continuation, greedy match).
ScoreFn = Callable[[list[np.ndarray], list[np.ndarray]], list[tuple[float, bool]]]

KINDS = ("multiple_choice", "language_modeling", "schema")
SCORINGS = ("mean", "sum")
LENGTH_TASKS = ("associative_recall", "passkey", "induction", "flip_flop", "dyck")
FEWSHOT_TASKS = ("fewshot_operator", "fewshot_reverse", "fewshot_uppercase")
LENGTH_TOLERANCE = 0.05
# Random draws tried per sample before a length is declared out of reach.
_FIT_ATTEMPTS = 16

# Pairs handed to score_fn per call: enough to fill a batch, few enough for a lively progress bar.
_PAIRS_PER_CALL = 64
_FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "language_modeling": ("context", "continuation"),
    "schema": ("context_options", "continuation", "gold"),
}
_SHOTS_STREAM, _SUBSET_STREAM, _SYNTHETIC_STREAM = 0, 1, 2
_ALIASES = {"label": "name", "dataset_uri": "path", "icl_task_type": "kind",
            "random_baseline": "baseline"}


# ------------------------------------------------------------------------------------ scores


def centered_accuracy(acc: float, baseline: float) -> float:
  """(acc - baseline) / (1 - baseline): 0 at random guessing, 1 when perfect, < 0 below chance.

  Args:
    acc: accuracy in [0, 1].
    baseline: random-guess accuracy in [0, 1) (0.25 for 4-way multiple choice).

  Returns:
    The centered accuracy.
  """
  if not 0.0 <= baseline < 1.0:
    raise ValueError(
        f"baseline={baseline!r} must be a fraction in [0, 1); percentages (as in DCLM's "
        f"eval_meta_data.csv, e.g. 25.0) must be divided by 100")
  if not 0.0 <= acc <= 1.0:
    raise ValueError(f"acc={acc!r} must be an accuracy in [0, 1]")
  return (acc - baseline) / (1.0 - baseline)


def core_score(results: Mapping[str, Any]) -> Optional[float]:
  """DCLM's Core aggregate: the mean centered accuracy over the tasks present.

  Args:
    results: `run_task_files` output ({"tasks": {...}}) or its "tasks" mapping; each task has
      "centered", or "accuracy" and "baseline".

  Returns:
    The mean centered accuracy, or None when there are no tasks.
  """
  tasks = results["tasks"] if "tasks" in results and isinstance(results["tasks"], Mapping) \
      else results
  values = []
  for name, task in tasks.items():
    if "centered" in task:
      values.append(float(task["centered"]))
    elif "accuracy" in task and "baseline" in task:
      values.append(centered_accuracy(task["accuracy"], task["baseline"]))
    else:
      raise ValueError(f"task {name!r} has neither 'centered' nor 'accuracy' and 'baseline'")
  return float(np.mean(values)) if values else None


# -------------------------------------------------------------------------------- task specs


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task file and how to prompt it (see the module docstring for the JSON form).

  Attributes:
    name: label in the results.
    path: JSONL file in the format of `kind`.
    kind: one of KINDS.
    num_fewshot: shots before each query.
    baseline: random-guess accuracy (fraction); None derives it from the file.
    example_delimiter: between the prompt string, the shots and the query.
    continuation_delimiter: between a context and its answer.
    prompt_string: text before everything (LLM-Foundry's preamble), "" for none.
    scoring: "mean" (per-token NLL, LLM-Foundry) or "sum" to rank choices.
  """

  name: str
  path: str
  kind: str
  num_fewshot: int = 0
  baseline: Optional[float] = None
  example_delimiter: str = "\n"
  continuation_delimiter: str = " "
  prompt_string: str = ""
  scoring: str = "mean"

  def __post_init__(self):
    where = f"task spec {self.name!r}"
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"task spec name={self.name!r} must be a non-empty string")
    if not isinstance(self.path, str) or not self.path:
      raise ValueError(f"{where}: path={self.path!r} must be the path of a JSONL file")
    if self.kind not in KINDS:
      raise ValueError(f"{where}: kind={self.kind!r} is not one of {', '.join(KINDS)}")
    if isinstance(self.num_fewshot, bool) or not isinstance(self.num_fewshot, int) \
        or self.num_fewshot < 0:
      raise ValueError(f"{where}: num_fewshot={self.num_fewshot!r} must be an int >= 0")
    if self.baseline is not None:
      if isinstance(self.baseline, bool) or not isinstance(self.baseline, (int, float)) \
          or not 0.0 <= self.baseline < 1.0:
        raise ValueError(
            f"{where}: baseline={self.baseline!r} must be a fraction in [0, 1) (divide a "
            f"percentage by 100) or null to derive it from the file")
    for field in ("example_delimiter", "continuation_delimiter", "prompt_string"):
      if not isinstance(getattr(self, field), str):
        raise ValueError(f"{where}: {field}={getattr(self, field)!r} must be a string")
    if self.scoring not in SCORINGS:
      raise ValueError(f"{where}: scoring={self.scoring!r} is not one of {', '.join(SCORINGS)}")

  @classmethod
  def from_dict(cls, entry: Mapping[str, Any], *, base_dir: Optional[str] = None,
                where: str = "task spec") -> "TaskSpec":
    """Builds a spec from its JSON object, accepting LLM-Foundry's field names.

    Args:
      entry: the object (see the module docstring).
      base_dir: folder that a relative path is taken from (None: as given).
      where: how errors name the entry.

    Returns:
      The TaskSpec.
    """
    if not isinstance(entry, Mapping):
      raise ValueError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in entry.items():
      field = _ALIASES.get(key, key)
      if field not in fields:
        raise ValueError(f"{where}: unknown field {key!r}; allowed: "
                         f"{', '.join(sorted(fields | set(_ALIASES)))}")
      if field in kwargs:
        raise ValueError(f"{where}: field {field!r} is given twice (once as {key!r})")
      kwargs[field] = value
    for field in ("name", "path", "kind"):
      if field not in kwargs:
        raise ValueError(f"{where}: missing required field {field!r}")
    shots = kwargs.get("num_fewshot")
    if isinstance(shots, list):
      # LLM-Foundry lists shot counts; one run here evaluates one count.
      if len(shots) != 1:
        raise ValueError(f"{where}: num_fewshot={shots!r}: give one count per spec (copy the "
                         f"spec with another name for each count)")
      kwargs["num_fewshot"] = shots[0]
    if base_dir is not None and isinstance(kwargs["path"], str) \
        and not os.path.isabs(kwargs["path"]):
      kwargs["path"] = os.path.join(base_dir, kwargs["path"])
    try:
      return cls(**kwargs)
    except ValueError as err:
      raise ValueError(f"{where}: {err}") from None


def load_task_specs(path: str) -> list[TaskSpec]:
  """Reads a JSON list of task specs (or {"icl_tasks": [...]}); relative paths are taken from
  the spec file's folder.

  Args:
    path: the JSON file.

  Returns:
    The specs, in file order.
  """
  with open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as err:
      raise ValueError(f"{path}, line {err.lineno}: invalid JSON ({err.msg})") from None
  if isinstance(data, Mapping) and "icl_tasks" in data:
    data = data["icl_tasks"]
  if not isinstance(data, list):
    raise ValueError(f"{path}: expected a JSON list of task specs (or {{\"icl_tasks\": [...]}})")
  base_dir = os.path.dirname(os.path.abspath(path))
  specs = [TaskSpec.from_dict(entry, base_dir=base_dir, where=f"{path}, task spec {i}")
           for i, entry in enumerate(data)]
  _check_unique(specs)
  return specs


# The name the evaluation CLI uses.
load_specs = load_task_specs


def _check_seed(seed) -> None:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed={seed!r} must be an int >= 0")


def _stream(seed: int, *key: int) -> np.random.Generator:
  # Named streams of one seed: no two keys collide (entropy lists of different lengths can,
  # as numpy pads them with zeros).
  _check_seed(seed)
  return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _check_unique(specs: Sequence[TaskSpec]) -> None:
  names = [spec.name for spec in specs]
  duplicates = sorted({name for name in names if names.count(name) > 1})
  if duplicates:
    raise ValueError(f"task names must be unique; repeated: {', '.join(duplicates)}")


def _as_specs(specs) -> list[TaskSpec]:
  if isinstance(specs, (str, os.PathLike)):
    return load_task_specs(os.fspath(specs))
  if isinstance(specs, (TaskSpec, Mapping)):
    specs = [specs]
  out = [spec if isinstance(spec, TaskSpec) else TaskSpec.from_dict(spec, where=f"task spec {i}")
         for i, spec in enumerate(specs)]
  _check_unique(out)
  return out


# -------------------------------------------------------------------------------- task files


def read_task_file(spec: TaskSpec) -> list[dict]:
  """Reads and validates a task file.

  Args:
    spec: the task (its path and kind).

  Returns:
    The examples in file order, each with its 1-based line number under "_line".
  """
  if not os.path.exists(spec.path):
    raise FileNotFoundError(f"task {spec.name!r}: no file at {spec.path}")
  examples = []
  with open(spec.path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{spec.path}, line {line_no}"
      try:
        example = json.loads(line)
      except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
      if not isinstance(example, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(example).__name__}")
      _check_example(example, spec.kind, where)
      examples.append({**example, "_line": line_no})
  if not examples:
    raise ValueError(f"{spec.path}: no examples (task {spec.name!r})")
  if spec.num_fewshot >= len(examples):
    raise ValueError(
        f"task {spec.name!r}: num_fewshot={spec.num_fewshot} needs at least "
        f"{spec.num_fewshot + 1} examples in {spec.path} (shots exclude the example itself), "
        f"it has {len(examples)}")
  return examples


def _check_example(example: dict, kind: str, where: str) -> None:
  for field in _FIELDS[kind]:
    if field not in example:
      raise ValueError(f"{where}: missing field {field!r} (a {kind} example needs "
                       f"{', '.join(_FIELDS[kind])})")
  for field in ("query", "context", "continuation"):
    if field in _FIELDS[kind] and not isinstance(example[field], str):
      raise ValueError(f"{where}: field {field!r} must be a string, got "
                       f"{type(example[field]).__name__}")
  if kind == "language_modeling":
    if not example["continuation"]:
      raise ValueError(f"{where}: field 'continuation' is empty")
    return
  options = "choices" if kind == "multiple_choice" else "context_options"
  values, gold = example[options], example["gold"]
  if not isinstance(values, list) or not all(isinstance(v, str) for v in values) \
      or len(values) < 2:
    raise ValueError(f"{where}: field {options!r} must be a list of at least 2 strings")
  if isinstance(gold, bool) or not isinstance(gold, int):
    raise ValueError(f"{where}: field 'gold' must be an int, got {gold!r}")
  if not 0 <= gold < len(values):
    raise ValueError(f"{where}: gold={gold} is out of range for {len(values)} {options} "
                     f"(must be 0..{len(values) - 1})")


def _baseline(spec: TaskSpec, examples: Sequence[dict]) -> float:
  if spec.baseline is not None:
    return float(spec.baseline)
  if spec.kind == "language_modeling":
    return 0.0
  options = "choices" if spec.kind == "multiple_choice" else "context_options"
  return float(np.mean([1.0 / len(ex[options]) for ex in examples]))


def fewshot_indices(num_examples: int, index: int, k: int, seed: int) -> list[int]:
  """The k shots of example `index`: distinct, never `index`, fixed by (seed, index).

  Args:
    num_examples: examples in the file.
    index: the evaluated example.
    k: number of shots (< num_examples).
    seed: the run's seed.

  Returns:
    k example indices, in prompt order.
  """
  if k == 0:
    return []
  rng = _stream(seed, _SHOTS_STREAM, index)
  picks = rng.choice(num_examples - 1, size=k, replace=False)
  # Drawing from the other num_examples - 1 and skipping over `index` keeps the draw uniform.
  return [int(j) + int(j >= index) for j in picks.tolist()]


def _answer_text(spec: TaskSpec, example: dict) -> tuple[str, str]:
  if spec.kind == "multiple_choice":
    return example["query"], example["choices"][example["gold"]]
  if spec.kind == "language_modeling":
    return example["context"], example["continuation"]
  return example["context_options"][example["gold"]], example["continuation"]


def build_prompts(spec: TaskSpec, examples: Sequence[dict], index: int,
                  seed: int) -> list[tuple[str, str]]:
  """The (prompt, continuation) texts scored for one example: one per choice or context option.

  Args:
    spec: the task.
    examples: the file's examples (`read_task_file`).
    index: the evaluated example.
    seed: the run's seed (chooses the shots).

  Returns:
    (prompt_text, continuation_text) pairs; multiple_choice: one per choice, schema: one per
    context option, language_modeling: one.
  """
  delim = spec.continuation_delimiter
  stripped = delim.rstrip()
  head, tail = stripped, delim[len(stripped):]
  pieces = [spec.prompt_string] if spec.prompt_string else []
  for j in fewshot_indices(len(examples), index, spec.num_fewshot, seed):
    context, answer = _answer_text(spec, examples[j])
    pieces.append(context + delim + answer)
  prefix = "".join(piece + spec.example_delimiter for piece in pieces)
  example = examples[index]
  if spec.kind == "multiple_choice":
    contexts = [example["query"]] * len(example["choices"])
    continuations = example["choices"]
  elif spec.kind == "language_modeling":
    contexts, continuations = [example["context"]], [example["continuation"]]
  else:
    contexts = example["context_options"]
    continuations = [example["continuation"]] * len(contexts)
  return [(prefix + context + head, tail + cont) for context, cont in zip(contexts, continuations)]


def encode_prompt(tokenizer: Tokenizer, text: str) -> np.ndarray:
  """eot_id followed by the text's tokens, as int32 (the start of a document in training)."""
  ids = np.asarray(tokenizer.encode(text), dtype=np.int32).reshape(-1)
  return np.concatenate([np.array([tokenizer.eot_id], np.int32), ids])


def _encode(tokenizer: Tokenizer, text: str) -> np.ndarray:
  return np.asarray(tokenizer.encode(text), dtype=np.int32).reshape(-1)


def _score(score_fn: ScoreFn, prompts: list[np.ndarray],
           continuations: list[np.ndarray]) -> list[tuple[float, bool]]:
  results = list(score_fn(prompts, continuations))
  if len(results) != len(prompts):
    raise ValueError(f"score_fn returned {len(results)} results for {len(prompts)} pairs; it "
                     f"must return one (mean_nll, greedy_match) per pair")
  return [(float(nll), bool(match)) for nll, match in results]


def _is_correct(spec: TaskSpec, example: dict, results, continuations) -> bool:
  if spec.kind == "language_modeling":
    return results[0][1]
  nll = np.array([r[0] for r in results], dtype=np.float64)
  if spec.scoring == "sum":
    nll = nll * np.array([len(c) for c in continuations], dtype=np.float64)
  # A NaN score must never win.
  nll = np.where(np.isnan(nll), np.inf, nll)
  return int(np.argmin(nll)) == example["gold"]


def run_task_files(score_fn: ScoreFn, tokenizer: Tokenizer, specs, *, seed: int = 0,
                   max_examples: Optional[int] = None, progress: bool = True,
                   max_tokens: Optional[int] = None) -> dict:
  """Evaluates LLM-Foundry / DCLM task files and their Core aggregate.

  Every file is read and validated before anything is scored, so a bad file fails fast.

  Args:
    score_fn: (prompt ids, continuation ids) -> [(mean NLL, greedy match)] (module docstring).
    tokenizer: encodes prompts (after an eot_id) and continuations separately.
    specs: TaskSpecs, dicts in the spec JSON form, or the path of a spec file.
    seed: chooses the shots (and the subset under max_examples).
    max_examples: evaluate at most this many examples per task, a seeded random subset (shots
      are still drawn from the whole file); None for all.
    progress: show a tqdm bar per task.
    max_tokens: if set, prompts are cut from the left so prompt + continuation fits (the
      model's context length); None passes them whole.

  Returns:
    {"tasks": {name: {"accuracy", "centered", "baseline", "n", "kind", "num_fewshot"}},
     "core": mean centered accuracy, or None without tasks}.
  """
  specs = _as_specs(specs)
  _check_seed(seed)
  if max_examples is not None and (isinstance(max_examples, bool) or
                                   not isinstance(max_examples, int) or max_examples < 1):
    raise ValueError(f"max_examples={max_examples!r} must be an int >= 1 or None")
  if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 2):
    raise ValueError(f"max_tokens={max_tokens!r} must be an int >= 2 or None")
  files = [(spec, read_task_file(spec)) for spec in specs]
  tasks = {}
  for spec, examples in files:
    order = np.arange(len(examples))
    if max_examples is not None and max_examples < len(examples):
      order = np.sort(_stream(seed, _SUBSET_STREAM).choice(
          len(examples), size=max_examples, replace=False))
    correct = 0
    bar = tqdm(total=len(order), desc=f"icl {spec.name}", disable=not progress, leave=False)
    start = 0
    while start < len(order):
      # Whole examples per call, about _PAIRS_PER_CALL pairs.
      batch, prompts, conts = [], [], []
      while start < len(order) and (not batch or len(prompts) < _PAIRS_PER_CALL):
        index = int(order[start])
        pairs = build_prompts(spec, examples, index, seed)
        ids = [_encode_pair(tokenizer, spec, examples[index], p, c, max_tokens) for p, c in pairs]
        batch.append((index, len(prompts), len(ids)))
        prompts += [p for p, _ in ids]
        conts += [c for _, c in ids]
        start += 1
      results = _score(score_fn, prompts, conts)
      for index, first, count in batch:
        correct += _is_correct(spec, examples[index], results[first:first + count],
                               conts[first:first + count])
      bar.update(len(batch))
    bar.close()
    accuracy = correct / len(order)
    baseline = _baseline(spec, examples)
    tasks[spec.name] = {"accuracy": accuracy, "centered": centered_accuracy(accuracy, baseline),
                        "baseline": baseline, "n": int(len(order)), "kind": spec.kind,
                        "num_fewshot": spec.num_fewshot}
  return {"tasks": tasks, "core": core_score(tasks)}


def _encode_pair(tokenizer, spec, example, prompt, cont, max_tokens):
  prompt_ids, cont_ids = encode_prompt(tokenizer, prompt), _encode(tokenizer, cont)
  where = f"{spec.path}, line {example['_line']}"
  if cont_ids.size == 0:
    raise ValueError(f"{where}: continuation {cont!r} encodes to zero tokens")
  if max_tokens is not None:
    if cont_ids.size >= max_tokens:
      raise ValueError(f"{where}: the continuation has {cont_ids.size} tokens, no room for a "
                       f"prompt within max_tokens={max_tokens}")
    # Left truncation keeps the query and the nearest shots, as LLM-Foundry does.
    prompt_ids = prompt_ids[-(max_tokens - cont_ids.size):]
  return prompt_ids, cont_ids


# ---------------------------------------------------------------------------- synthetic tasks

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]
# The filler of the usual passkey test (Mohtashami & Jaggi, 2023).
_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
           "again.").split()
_BRACKETS = ("()", "[]", "{}", "<>")
_MAX_DYCK_DEPTH = 8
_OPERATORS = {"sum": lambda a, b: a + b, "difference": lambda a, b: a - b,
              "product": lambda a, b: a * b, "max": max, "min": min}
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
  return (f"A pass key is hidden in the text below. Remember it.\n{text}\n"
          f"What is the pass key? The pass key is"), f" {key}"


def _induction(rng, n):
  # n counts the words of both copies, so each step adds one word (BPE: a few tokens); the
  # second copy breaks off about halfway through the first.
  shown = max(1, n // 3)
  words = _distinct_words(rng, max(n - shown, shown + 1))
  answer = words[shown:shown + _INDUCTION_ANSWER_WORDS]
  return (f"Random words, then the same words again.\n{' '.join(words)}\n"
          f"{' '.join(words[:shown])}"), " " + " ".join(answer)


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


_LENGTH_BUILDERS = {"associative_recall": _associative_recall, "passkey": _passkey,
                    "induction": _induction, "flip_flop": _flip_flop, "dyck": _dyck}


def _fit_length(build, measure, target: int, what: str):
  """build(n, attempt) for the largest n whose length is <= target, if that is within 5% of it.

  Never longer than the target, so a target equal to a model's context length fits it. When a
  unit is coarse next to the 5% window (a key-value pair of a short target), the largest n may
  fall short; another attempt (another random draw of the same sample) then usually fits.
  """
  closest = 0
  for attempt in range(_FIT_ATTEMPTS):
    cache = {}

    def length(n):
      if n not in cache:
        cache[n] = measure(*build(n, attempt))
      return cache[n]

    lo = 1
    if length(lo) > target:
      raise ValueError(f"{what}: the shortest example has {length(lo)} tokens, more than the "
                       f"target length {target}; ask for a length of at least {length(lo)}")
    hi = 2
    while length(hi) <= target:
      lo, hi = hi, hi * 2
      if hi > 64 * target:
        raise ValueError(f"{what}: cannot reach {target} tokens (the tokenizer encodes nothing?)")
    # Invariant: length(lo) <= target < length(hi).
    while hi - lo > 1:
      mid = (lo + hi) // 2
      if length(mid) <= target:
        lo = mid
      else:
        hi = mid
    if length(lo) >= (1 - LENGTH_TOLERANCE) * target:
      return build(lo, attempt)
    closest = max(closest, length(lo))
  raise ValueError(f"{what}: the closest example has {closest} tokens, more than 5% below the "
                   f"target length {target}; pick another length")


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


_FEWSHOT_BUILDERS = {"fewshot_operator": _fewshot_operator,
                     "fewshot_reverse": _word_mapping(lambda w: w[::-1]),
                     "fewshot_uppercase": _word_mapping(str.upper)}


def _check_tasks(tasks) -> tuple[str, ...]:
  valid = synthetic_tasks()
  if tasks is None:
    return valid
  if isinstance(tasks, str):
    tasks = (tasks,)
  unknown = [t for t in tasks if t not in valid]
  if unknown:
    raise ValueError(f"unknown synthetic task(s) {', '.join(map(repr, unknown))}; valid names: "
                     f"{', '.join(valid)}")
  return tuple(tasks)


def _check_counts(name: str, values, minimum: int) -> tuple[int, ...]:
  values = tuple(values)
  if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum
                       for v in values):
    raise ValueError(f"{name}={values!r} must be a non-empty sequence of ints >= {minimum}")
  return tuple(int(v) for v in values)


def synthetic_examples(task: str, tokenizer: Tokenizer, *, shots: Optional[int] = None,
                       length: Optional[int] = None, samples: int = 16, seed: int = 0,
                       max_shots: Optional[int] = None) -> list[tuple[str, str]]:
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
  if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
    raise ValueError(f"samples={samples!r} must be an int >= 1")
  task_id = zlib.crc32(task.encode())
  if task in _FEWSHOT_BUILDERS:
    if shots is None or length is not None:
      raise ValueError(f"task {task!r} is evaluated by number of shots: pass shots=, not length=")
    (shots,) = _check_counts("shots", (shots,), 0)
    (max_shots,) = _check_counts("max_shots", (shots if max_shots is None else max_shots,), shots)
    pairs = []
    for i in range(samples):
      lines, query, answer = _FEWSHOT_BUILDERS[task](
          _stream(seed, _SYNTHETIC_STREAM, task_id, i), max_shots)
      pairs.append(("\n".join(lines[:shots] + [query]), answer))
    return pairs
  if length is None or shots is not None:
    raise ValueError(f"task {task!r} is evaluated by context length: pass length=, not shots=")
  (length,) = _check_counts("length", (length,), 1)

  def measure(prompt, answer):
    return 1 + _encode(tokenizer, prompt).size + _encode(tokenizer, answer).size

  pairs = []
  for i in range(samples):
    key = (_SYNTHETIC_STREAM, task_id, length, i)
    # A fresh generator per try: the n that fits is searched for, the sample stays the same.
    build = lambda n, attempt, k=key: _LENGTH_BUILDERS[task](_stream(seed, *k, attempt), n)
    pairs.append(_fit_length(build, measure, length, f"task {task!r}, length {length}"))
  return pairs


def run_synthetic(score_fn: ScoreFn, tokenizer: Tokenizer, *, tasks=None,
                  shots: Sequence[int] = (0, 1, 2, 4, 8),
                  lengths: Sequence[int] = (256, 512, 1024), samples: int = 16, seed: int = 0,
                  progress: bool = True) -> dict:
  """Greedy exact-match accuracy on the synthetic tasks, by shots or by length.

  Args:
    score_fn: (prompt ids, continuation ids) -> [(mean NLL, greedy match)] (module docstring).
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
                      "accuracy": mean over the shots or lengths}},
     "accuracy": mean over the tasks}.
  """
  names = _check_tasks(tasks)
  _check_seed(seed)
  shots = _check_counts("shots", shots, 0)
  lengths = _check_counts("lengths", lengths, 1)
  if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
    raise ValueError(f"samples={samples!r} must be an int >= 1")
  cells = [(name, "shots" if name in _FEWSHOT_BUILDERS else "length", value)
           for name in names
           for value in (shots if name in _FEWSHOT_BUILDERS else lengths)]
  bar = tqdm(total=len(cells) * samples, desc="synthetic icl", disable=not progress, leave=False)
  out = {}
  for name, axis, value in cells:
    extra = {"max_shots": max(shots)} if axis == "shots" else {}
    pairs = synthetic_examples(name, tokenizer, **{axis: value}, samples=samples, seed=seed,
                               **extra)
    prompts = [encode_prompt(tokenizer, prompt) for prompt, _ in pairs]
    answers = [_encode(tokenizer, answer) for _, answer in pairs]
    results = _score(score_fn, prompts, answers)
    task = out.setdefault(name, {f"by_{axis}": {}, f"nll_by_{axis}": {}})
    task[f"by_{axis}"][str(value)] = float(np.mean([match for _, match in results]))
    task[f"nll_by_{axis}"][str(value)] = float(np.mean([nll for nll, _ in results]))
    bar.update(samples)
  bar.close()
  for task in out.values():
    accuracies = next(v for k, v in task.items() if k.startswith("by_"))
    task["accuracy"] = float(np.mean(list(accuracies.values())))
  return {"tasks": out,
          "accuracy": float(np.mean([t["accuracy"] for t in out.values()])) if out else None}
