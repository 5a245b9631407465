"""RULER's QA tasks (qa_1: SQuAD, qa_2: HotpotQA): reading local dev files and building a
question's prompt with its gold documents among distractor documents."""

from __future__ import annotations

import dataclasses
import functools
import os

from rove_jax.evaluation import prompting
from rove_jax.evaluation.ruler.haystack import Built, Exhausted, Problem, Stream, place, task_rng

_QA_INSTRUCTION = (
  "Answer the question based on the given documents. Only give me the answer "
  "and do not output any other words."
)


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


def qa_candidates(task: str, seed: int, path) -> list:
  name = "squad_path" if task == "qa_1" else "hotpot_path"
  if path is None:
    raise ValueError(
      f"task {task!r} needs {name}: a local "
      f"{'SQuAD' if task == 'qa_1' else 'HotpotQA'} dev JSON file"
    )
  data = load_squad(path) if task == "qa_1" else load_hotpotqa(path)
  rng = task_rng(task, seed, 0)
  # Questions in seeded order; generate() takes the first whose gold documents fit, so a long
  # gold context at a short length moves on instead of failing the evaluation. 64 tries bound
  # the work when nothing fits.
  picks = rng.permutation(len(data.questions))[:64]
  return [functools.partial(_qa_problem, task, seed, data, int(q)) for q in picks]


def _qa_problem(task: str, seed: int, data: QAData, qi: int) -> Problem:
  q = data.questions[qi]
  rng = task_rng(task, seed, 1 + qi)
  gold = set(q.gold)
  others = [i for i in range(len(data.docs)) if i not in gold]
  perm = rng.permutation(len(others)) if others else []

  def segment(i: int) -> str:
    if not others:
      raise Exhausted
    # Cycled when the file has fewer documents than the length needs.
    return data.docs[others[int(perm[i % len(others)])]]

  stream = Stream(segment)
  depths = rng.random(len(q.gold)).tolist()
  gold_docs = [data.docs[i] for i in q.gold]
  tail = f"\n\n{_QA_INSTRUCTION}\n\nQuestion: {q.question} Answer:"

  def build(n: int, c: int) -> Built:
    segs, cut = stream.prefix(n, c) if n or c else ([], None)
    pieces, _ = place(segs, cut, depths, gold_docs)
    docs = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(pieces))
    prompt = f"{_QA_INSTRUCTION}\n\nThe following are given documents.\n\n{docs}{tail}"
    # 1-based numbers of the gold documents (distractors never repeat a gold text).
    where = [pieces.index(d) + 1 for d in gold_docs]
    meta = {
      "question": q.question,
      "question_index": qi,
      "gold_documents": where,
      "documents": len(pieces),
      "depths": depths,
    }
    return Built(prompt, " " + q.answers[0], list(q.answers), meta)

  return Problem(build, 0, stream.word)


# ------------------------------------------------------------------------------- QA files


def _file_key(path):
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"QA file {path!r} does not exist")
  st = os.stat(path)
  return os.path.abspath(path), st.st_mtime_ns, st.st_size


_FORMS = {
  "squad": (
    '{"data": [{"paragraphs": [{"context": str, "qas": [{"question": str, "answers": '
    '[{"text": str}]}]}]}]}'
  ),
  "hotpot": '[{"question": str, "answer": str, "context": [[title, [sentence, ...]], ...]}]',
}
_NAMES = {"squad": "SQuAD", "hotpot": "HotpotQA"}


class _Malformed(Exception):
  """Where a QA file departs from its format (turned into a ValueError by `_load_qa`)."""


@functools.lru_cache(maxsize=4)
def _load_qa(kind: str, path: str, mtime_ns: int, size: int) -> QAData:
  # Keyed on mtime and size so an edited file is read again.
  try:
    obj = prompting.read_json(path)
  except UnicodeDecodeError as e:
    raise ValueError(f"{path} is not UTF-8 text ({e}); give a {_NAMES[kind]} JSON file") from None
  docs: dict[str, int] = {}
  try:
    questions = (_squad if kind == "squad" else _hotpot)(obj, docs)
  except _Malformed as e:
    raise ValueError(
      f"{path} is not a {_NAMES[kind]} file; expected {_FORMS[kind]}, but {e}"
    ) from None
  if not questions:
    raise ValueError(
      f"{path} holds no answerable questions; give a {_NAMES[kind]} dev file with "
      f"at least one answered question"
    )
  if all(len(q.gold) >= len(docs) for q in questions):
    raise ValueError(
      f"{path} holds no document besides its questions' own ({len(docs)} in all): "
      f"the QA tasks surround a question's documents with the file's other "
      f"documents as distractors; give a fuller {_NAMES[kind]} dev file (the "
      f"official one)"
    )
  return QAData(tuple(docs), tuple(questions))


def _squad(obj, docs: dict) -> list:
  questions = []
  for i, article in enumerate(_field(obj, "data", list, "")):
    for j, para in enumerate(_field(article, "paragraphs", list, f"data[{i}]")):
      where = f"data[{i}].paragraphs[{j}]"
      di = docs.setdefault(_field(para, "context", str, where), len(docs))
      for k, qa in enumerate(_field(para, "qas", list, where)):
        at = f"{where}.qas[{k}]"
        question = _field(qa, "question", str, at)
        answers = _field(qa, "answers", list, at, default=[])  # SQuAD 2.0: [] if unanswerable
        texts = [_field(a, "text", str, f"{at}.answers[{n}]") for n, a in enumerate(answers)]
        texts = tuple(dict.fromkeys(t for t in texts if t))
        if texts:
          questions.append(QAQuestion(question, texts, (di,)))
  return questions


def _hotpot(obj, docs: dict) -> list:
  if not isinstance(obj, list):
    raise _Malformed(f"the top level is {_kind(obj)}, not a list")
  questions = []
  for i, ex in enumerate(obj):
    where = f"[{i}]"
    question = _field(ex, "question", str, where)
    answer = _field(ex, "answer", str, where)
    gold = []
    for j, pair in enumerate(_field(ex, "context", list, where)):
      at = f"{where}.context[{j}]"
      if not (
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(pair[0], str)
        and isinstance(pair[1], list)
        and all(isinstance(x, str) for x in pair[1])
      ):
        raise _Malformed(f"{at} is not a [title, [sentence, ...]] pair of strings")
      gold.append(docs.setdefault(f"{pair[0]}\n{''.join(pair[1])}", len(docs)))
    if answer:
      questions.append(QAQuestion(question, (answer,), tuple(dict.fromkeys(gold))))
  return questions


_MISSING = object()


def _field(obj, key: str, kind: type, where: str, default=_MISSING):
  """obj[key], checked to be a `kind`; `where` locates obj in the file ("" at the top)."""
  if not isinstance(obj, dict):
    raise _Malformed(f"{where or 'the top level'} is {_kind(obj)}, not an object")
  if key not in obj and default is not _MISSING:
    return default
  if key not in obj:
    raise _Malformed(f"{where or 'the top level'} has no {key!r}")
  value = obj[key]
  if not isinstance(value, kind):
    name = f"{where}.{key}" if where else key
    raise _Malformed(f"{name} is {_kind(value)}, not {_kind(kind())}")
  return value


def _kind(value) -> str:
  """A JSON value's kind, with its article: "an object", "a list", "a string", "null"..."""
  if value is None:
    return "null"
  names = {
    bool: "a boolean",
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
  }
  return names.get(type(value), type(value).__name__)
