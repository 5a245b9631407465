"""RULER's QA tasks (qa_1: SQuAD, qa_2: HotpotQA): reading local dev files and building a
question's prompt with its gold documents among distractor documents."""

from __future__ import annotations

import dataclasses
import functools
import os

from rove_jax.evaluation import prompting
from rove_jax.evaluation.ruler_haystack import Built, Exhausted, Problem, Stream, place, task_rng

_QA_INSTRUCTION = ("Answer the question based on the given documents. Only give me the answer "
                   "and do not output any other words.")


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
    raise ValueError(f"task {task!r} needs {name}: a local "
                     f"{'SQuAD' if task == 'qa_1' else 'HotpotQA'} dev JSON file")
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
    meta = {"question": q.question, "question_index": qi, "gold_documents": where,
            "documents": len(pieces), "depths": depths}
    return Built(prompt, " " + q.answers[0], list(q.answers), meta)

  return Problem(build, 0, stream.word)


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
  obj = prompting.read_json(path)
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

