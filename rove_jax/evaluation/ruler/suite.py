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

Code: this module (generate, evaluate); ruler_tasks (the niah/vt/cwe/fwe builders), ruler_qa
(SQuAD/HotpotQA files and the QA builders), ruler_haystack (word material, haystack streams,
needle placement, fitting with refinement); prompting (what RULER shares with ICL: tokenizer
protocol, encoding, filler text, length fitting, answer scoring).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from rove_jax.evaluation import prompting
from rove_jax.evaluation.prompting import ScoreFn, Tokenizer
from rove_jax.evaluation.ruler import tasks as ruler_tasks
from rove_jax.evaluation.ruler.haystack import TOLERANCE, fit_problem
from rove_jax.evaluation.ruler.qa import QAData, QAQuestion, load_hotpotqa, load_squad
from rove_jax.evaluation.ruler.tasks import NIAH

__all__ = [
  "TASKS",
  "QA_TASKS",
  "TOLERANCE",
  "Sample",
  "generate",
  "evaluate",
  "evaluate_settings",
  "sample_row",
  "QAData",
  "QAQuestion",
  "load_squad",
  "load_hotpotqa",
  "ScoreFn",
  "Tokenizer",
]

TASKS = (
  "niah_single_1",
  "niah_single_2",
  "niah_single_3",
  "niah_multikey_1",
  "niah_multikey_2",
  "niah_multikey_3",
  "niah_multivalue",
  "niah_multiquery",
  "vt",
  "cwe",
  "fwe",
)
QA_TASKS = ("qa_1", "qa_2")


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


# ------------------------------------------------------------------------------- public API


def generate(
  task: str,
  *,
  length: int,
  tokenizer: Tokenizer,
  seed: int,
  haystack_texts: Optional[Sequence[str]] = None,
  squad_path=None,
  hotpot_path=None,
) -> Sample:
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
  prompting.check_int("length", length, 1)
  prompting.check_int("seed", seed, 0)
  prompting.check_tokenizer(tokenizer)
  problem, smallest = None, math.inf
  for make, room in ruler_tasks.candidates(
    task, seed, length, haystack_texts, squad_path, hotpot_path
  ):
    p = make()
    smallest_built = p.build(p.n_min, 0)
    p_min = prompting.count_tokens(tokenizer, smallest_built.prompt, smallest_built.answer)
    smallest = min(smallest, p_min)
    if p_min <= room:
      problem = p
      break
  if problem is None:
    raise ValueError(
      f"length={length} is too short for task {task!r}: its fixed parts (instruction, "
      f"needles, gold documents or repeated words, question and answer) take {smallest} "
      f"tokens with this tokenizer; use length >= {smallest}"
    )
  built, total = fit_problem(problem, length, tokenizer, task)
  prompt_ids = prompting.encode_prompt(tokenizer, built.prompt)
  answer_ids = prompting.encode(tokenizer, built.answer)
  if answer_ids.size == 0:
    raise ValueError(f"tokenizer encoded the answer {built.answer!r} of task {task!r} to no ids")
  meta = dict(built.meta, answer_text=built.answer, seed=seed, tokens=total)
  return Sample(
    task=task,
    length=length,
    prompt_ids=prompt_ids,
    answer_ids=answer_ids,
    answers=list(built.answers),
    meta=meta,
  )


def evaluate(
  score_fn: ScoreFn,
  tokenizer: Tokenizer,
  *,
  tasks: Sequence[str],
  lengths: Sequence[int],
  samples_per_task: int,
  seed: int,
  haystack_texts: Optional[Sequence[str]] = None,
  squad_path=None,
  hotpot_path=None,
  progress: bool = True,
) -> dict:
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
    {"tasks": {task: {str(length): ROW}}, "skipped": {task: reason}}, ROW = {"nll": mean,
     "exact_match": fraction, "n": count, "correct": count, "sample_nll": [per sample mean
     answer NLL, 6 significant digits], "sample_correct": [0 or 1 per sample]}; the lists
     are in sample order, which is the same for every run and setting given the seed.

  Raises:
    ValueError: unknown task names (the message lists the valid ones), a length too short for
      a task (raised before any score_fn call), or a score_fn returning the wrong count.
  """
  res = evaluate_settings(
    {"_": lambda length: score_fn},
    tokenizer,
    tasks=tasks,
    lengths=lengths,
    samples_per_task=samples_per_task,
    seed=seed,
    haystack_texts=haystack_texts,
    squad_path=squad_path,
    hotpot_path=hotpot_path,
    progress=progress,
  )
  return {"tasks": res["settings"]["_"]["tasks"], "skipped": res["skipped"]}


def evaluate_settings(
  score_fns: Mapping[str, Callable[[int], ScoreFn]],
  tokenizer: Tokenizer,
  *,
  tasks: Sequence[str],
  lengths: Sequence[int],
  samples_per_task: int,
  seed: int,
  haystack_texts: Optional[Sequence[str]] = None,
  squad_path=None,
  hotpot_path=None,
  progress: bool = True,
  sample_cache: Optional[dict] = None,
) -> dict:
  """`evaluate` under several model settings (e.g. with and without YaRN) on the same samples.

  Each (task, length) cell's samples are generated once and scored under every setting.

  Args:
    score_fns: {setting name: length -> ScoreFn}: the score function of each setting at each
      length (e.g. YaRN with a factor that depends on the length).
    tokenizer, tasks, lengths, samples_per_task, seed, haystack_texts, squad_path,
    hotpot_path, progress: as in `evaluate`.
    sample_cache: a dict that keeps the generated samples by (task, length, sample seed), for
      scoring several models on them without generating them again (on a small model the
      generation takes longer than the scoring). One cache per tokenizer and inputs: the
      caller keys it (rove-eval by tokenizer fingerprint, haystack and QA files).

  Returns:
    {"settings": {setting: {"tasks": {task: {str(length): ROW}}}}, "skipped": {task: reason}},
    ROW as in `evaluate`.

  Raises:
    ValueError: as `evaluate`.
  """
  if isinstance(tasks, str):
    raise ValueError(
      f"tasks must be a list of task names, got the string {tasks!r}; write tasks=[{tasks!r}]"
    )
  tasks = list(dict.fromkeys(tasks))
  unknown = [t for t in tasks if t not in TASKS + QA_TASKS]
  if unknown:
    raise ValueError(f"unknown RULER task(s) {unknown}; valid tasks: {list(TASKS + QA_TASKS)}")
  if not score_fns:
    raise ValueError("score_fns names no setting; give at least one")
  lengths = list(dict.fromkeys(lengths))
  for i, length in enumerate(lengths):
    prompting.check_int(f"lengths[{i}]", length, 1)
  prompting.check_int("samples_per_task", samples_per_task, 1)
  prompting.check_int("seed", seed, 0)
  inputs = dict(haystack_texts=haystack_texts, squad_path=squad_path, hotpot_path=hotpot_path)
  cache = {} if sample_cache is None else sample_cache

  def sample(t, n, s):
    if (t, n, s) not in cache:
      cache[(t, n, s)] = generate(t, length=n, tokenizer=tokenizer, seed=s, **inputs)
    return cache[(t, n, s)]

  skipped = {t: r for t in tasks if (r := _skip_reason(t, **inputs))}
  run = [t for t in tasks if t not in skipped]
  seeds = [_sample_seed(seed, i) for i in range(samples_per_task)]
  # The first sample of every (task, length) is built before any scoring, so a length that is
  # too short or a malformed file fails in seconds, not after hours of model time.
  first = {(t, n): sample(t, n, seeds[0]) for t in run for n in lengths}
  from tqdm.auto import tqdm  # imported here: generate() alone needs nothing beyond numpy

  results = {setting: {} for setting in score_fns}
  with tqdm(
    total=len(first) * samples_per_task * len(score_fns),
    desc="RULER",
    unit="sample",
    disable=not progress,
  ) as bar:
    for t in run:
      for n in lengths:
        samples = [first.pop((t, n))] + [sample(t, n, s) for s in seeds[1:]]
        for setting, make_fn in score_fns.items():
          bar.set_postfix_str(f"{t} @ {n}" + ("" if setting == "_" else f", {setting}"))
          scores = prompting.score_pairs(
            make_fn(n),
            [s.prompt_ids for s in samples],
            [s.answer_ids for s in samples],
            f" of task {t!r} at length {n}",
          )
          results[setting].setdefault(t, {})[str(n)] = sample_row(scores)
          bar.update(len(samples))
  return {
    "settings": {setting: {"tasks": rows} for setting, rows in results.items()},
    "skipped": skipped,
  }


def sample_row(scores: Sequence[tuple[float, bool]]) -> dict:
  """A cell's aggregates and per-sample records from `prompting.score_pairs` results."""
  nll, exact_match = prompting.mean_scores(scores)
  return {
    "nll": nll,
    "exact_match": exact_match,
    "n": len(scores),
    "correct": int(sum(match for _, match in scores)),
    **prompting.sample_records(scores),
  }


def _sample_seed(seed: int, i: int) -> int:
  return int(np.random.SeedSequence([seed, i]).generate_state(1)[0])


# ------------------------------------------------------------------------------- validation


def _check_task(task) -> None:
  if task not in TASKS + QA_TASKS:
    raise ValueError(f"unknown RULER task {task!r}; valid tasks: {list(TASKS + QA_TASKS)}")


def _skip_reason(task: str, haystack_texts, squad_path, hotpot_path) -> Optional[str]:
  if task == "qa_1" and squad_path is None:
    return "needs squad_path: a local SQuAD JSON file (e.g. dev-v2.0.json); none was given"
  if task == "qa_2" and hotpot_path is None:
    return (
      "needs hotpot_path: a local HotpotQA JSON file (e.g. "
      "hotpot_dev_distractor_v1.json); none was given"
    )
  if task in NIAH and NIAH[task].haystack == "essay" and haystack_texts is None:
    return "needs haystack_texts: essay-style documents for the haystack; none were given"
  return None
