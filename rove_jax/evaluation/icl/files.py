"""In-context learning from LLM-Foundry / DCLM task files (see `icl` for the score function).

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

Scores: centered accuracy (acc - baseline) / (1 - baseline) is 0 at chance and 1 when perfect;
DCLM's "Core" is its mean over the tasks evaluated (22 tasks in DCLM).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

from rove_jax.evaluation import prompting
from rove_jax.evaluation.icl.specs import TaskSpec, as_specs
from rove_jax.evaluation.prompting import ScoreFn, Tokenizer

# Pairs handed to score_fn per call: enough to fill a batch, few enough for a lively progress bar.
_PAIRS_PER_CALL = 64
_FIELDS = {
  "multiple_choice": ("query", "choices", "gold"),
  "language_modeling": ("context", "continuation"),
  "schema": ("context_options", "continuation", "gold"),
}
SHOTS_STREAM, SUBSET_STREAM, SYNTHETIC_STREAM = 0, 1, 2


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
      f"eval_meta_data.csv, e.g. 25.0) must be divided by 100"
    )
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
  tasks = (
    results["tasks"] if "tasks" in results and isinstance(results["tasks"], Mapping) else results
  )
  values = []
  for name, task in tasks.items():
    if "centered" in task:
      values.append(float(task["centered"]))
    elif "accuracy" in task and "baseline" in task:
      values.append(centered_accuracy(task["accuracy"], task["baseline"]))
    else:
      raise ValueError(f"task {name!r} has neither 'centered' nor 'accuracy' and 'baseline'")
  return float(np.mean(values)) if values else None


def seeded_stream(seed: int, *key: int) -> np.random.Generator:
  """The generator of stream `key` of `seed` (task files: SHOTS_STREAM, SUBSET_STREAM;
  synthetic tasks: SYNTHETIC_STREAM)."""
  # Named streams of one seed: no two keys collide (entropy lists of different lengths can,
  # as numpy pads them with zeros).
  prompting.check_int("seed", seed, 0)
  return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


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
      f"it has {len(examples)}"
    )
  return examples


def _check_example(example: dict, kind: str, where: str) -> None:
  for field in _FIELDS[kind]:
    if field not in example:
      raise ValueError(
        f"{where}: missing field {field!r} (a {kind} example needs {', '.join(_FIELDS[kind])})"
      )
  for field in ("query", "context", "continuation"):
    if field in _FIELDS[kind] and not isinstance(example[field], str):
      raise ValueError(
        f"{where}: field {field!r} must be a string, got {type(example[field]).__name__}"
      )
  if kind == "language_modeling":
    if not example["continuation"]:
      raise ValueError(f"{where}: field 'continuation' is empty")
    return
  options = "choices" if kind == "multiple_choice" else "context_options"
  values, gold = example[options], example["gold"]
  if not isinstance(values, list) or not all(isinstance(v, str) for v in values) or len(values) < 2:
    raise ValueError(f"{where}: field {options!r} must be a list of at least 2 strings")
  if isinstance(gold, bool) or not isinstance(gold, int):
    raise ValueError(f"{where}: field 'gold' must be an int, got {gold!r}")
  if not 0 <= gold < len(values):
    raise ValueError(
      f"{where}: gold={gold} is out of range for {len(values)} {options} "
      f"(must be 0..{len(values) - 1})"
    )


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
  rng = seeded_stream(seed, SHOTS_STREAM, index)
  picks = rng.choice(num_examples - 1, size=k, replace=False)
  # Drawing from the other num_examples - 1 and skipping over `index` keeps the draw uniform.
  return [int(j) + int(j >= index) for j in picks.tolist()]


def _answer_text(spec: TaskSpec, example: dict) -> tuple[str, str]:
  if spec.kind == "multiple_choice":
    return example["query"], example["choices"][example["gold"]]
  if spec.kind == "language_modeling":
    return example["context"], example["continuation"]
  return example["context_options"][example["gold"]], example["continuation"]


def build_prompts(
  spec: TaskSpec, examples: Sequence[dict], index: int, seed: int
) -> list[tuple[str, str]]:
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
  head, tail = stripped, delim[len(stripped) :]
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


def _is_correct(spec: TaskSpec, example: dict, results, continuations) -> bool:
  if spec.kind == "language_modeling":
    return results[0][1]
  nll = np.array([r[0] for r in results], dtype=np.float64)
  if spec.scoring == "sum":
    nll = nll * np.array([len(c) for c in continuations], dtype=np.float64)
  # A NaN score must never win.
  nll = np.where(np.isnan(nll), np.inf, nll)
  return int(np.argmin(nll)) == example["gold"]


def run_task_files(
  score_fn: ScoreFn,
  tokenizer: Tokenizer,
  specs,
  *,
  seed: int = 0,
  max_examples: Optional[int] = None,
  progress: bool = True,
  max_tokens: Optional[int] = None,
) -> dict:
  """Evaluates LLM-Foundry / DCLM task files and their Core aggregate.

  Every file is read and validated before anything is scored, so a bad file fails fast.

  Args:
    score_fn: (prompt ids, continuation ids) -> [(mean NLL, greedy match)] (prompting.ScoreFn).
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
  specs = as_specs(specs)
  prompting.check_int("seed", seed, 0)
  if max_examples is not None and (
    isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 1
  ):
    raise ValueError(f"max_examples={max_examples!r} must be an int >= 1 or None")
  if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 2):
    raise ValueError(f"max_tokens={max_tokens!r} must be an int >= 2 or None")
  files = [(spec, read_task_file(spec)) for spec in specs]
  tasks = {}
  for spec, examples in files:
    order = np.arange(len(examples))
    if max_examples is not None and max_examples < len(examples):
      order = np.sort(
        seeded_stream(seed, SUBSET_STREAM).choice(len(examples), size=max_examples, replace=False)
      )
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
      results = prompting.score_pairs(score_fn, prompts, conts)
      for index, first, count in batch:
        correct += _is_correct(
          spec, examples[index], results[first : first + count], conts[first : first + count]
        )
      bar.update(len(batch))
    bar.close()
    accuracy = correct / len(order)
    baseline = _baseline(spec, examples)
    tasks[spec.name] = {
      "accuracy": accuracy,
      "centered": centered_accuracy(accuracy, baseline),
      "baseline": baseline,
      "n": int(len(order)),
      "kind": spec.kind,
      "num_fewshot": spec.num_fewshot,
    }
  return {"tasks": tasks, "core": core_score(tasks)}


def _encode_pair(tokenizer, spec, example, prompt, cont, max_tokens):
  prompt_ids = prompting.encode_prompt(tokenizer, prompt)
  cont_ids = prompting.encode(tokenizer, cont)
  where = f"{spec.path}, line {example['_line']}"
  if cont_ids.size == 0:
    raise ValueError(f"{where}: continuation {cont!r} encodes to zero tokens")
  if max_tokens is not None:
    if cont_ids.size >= max_tokens:
      raise ValueError(
        f"{where}: the continuation has {cont_ids.size} tokens, no room for a "
        f"prompt within max_tokens={max_tokens}"
      )
    # Left truncation keeps the query and the nearest shots, as LLM-Foundry does.
    prompt_ids = prompt_ids[-(max_tokens - cont_ids.size) :]
  return prompt_ids, cont_ids
