"""Synthetic multi-query associative recall (MQAR): the "recall" corpus source and test sets.

`RecallSpec.task` picks the task: "mqar" (this docstring: content retrieval, no position
needed) or one of the position-dependent tasks "lastwrite" and "offset", whose documents and
test samples rove_jax.tasks.recall_tasks generates in the same layout and alphabets.

Shape letters (here): D documents, N test samples, L tokens of a test sample, T = seq_len,
P records (key-value pairs), Q queries.

Tokens are ASCII characters, so the byte tokenizer maps every character to one token (its
code):
  keys     the first `keys` of '0'..'9'
  records  'A'..'Z', 'a'..'z': record (k, v) is RECORD_CHARS[k * values + v], one token that
           holds key k and value v (keys * values <= 52)
  filler   '!'..'*' (ten punctuation characters), uniformly random

A query is a key token followed by the record holding that key in the context, the answer: the
model has to find the record of the queried key among the others and copy it. Each record is
one token, so one attention hop retrieves it (content match on the key, copy of the token):
this is what makes the recall learnable in a couple of thousand steps by a 2-layer model.
(Sizing: with the key and the value as two adjacent tokens, which needs an induction circuit,
a previous-token head and a match on its output, RoPE models of this size stayed at the level
of copying a random context value, ~25-30 %, for 2,500 steps; a random-offset copy task showed
the same plateau.) Keys are distinct within a document, so every query has exactly one answer;
values are uniform, so a model that knows the queried key but has not found its record is right
1 / values of the time, and one that copies a random record of the context 1 / P.

Documents (`training_tokens`, `documents`: the "recall" corpus source; `RecallSpec` sets the
sizes):
  document = context (C = L - 1 - 2Q tokens) + Q queries x (key, record)
  context  = P records (distinct keys, uniform values) at uniformly random positions, filler
             elsewhere
  queries  = Q keys, each drawn uniformly from the P records' keys, independently (no order
             or count gives an answer away: only the key does)
Training documents have L = T: each is T - 1 tokens, and the token stream puts the end-of-text
id after it. The first document of a split carries one extra leading filler token, which puts
every later document at the start of a training window right after the end-of-text of the one
before it: window inputs = [eot] + document, targets = document + [eot] (the pipeline's windows
start at multiples of T). With answer_loss=1 (the default) only the query answers count in the
loss (`loss_mask`: targets C + 1, C + 3, ..., C + 2Q - 1, the same in every window); with
answer_loss=0 every token does (the rest is uniform noise).

Test samples at length L (`test_samples`; exactly L tokens, L = T being a training document):
  sample = [eot] + a document of length L whose FIRST query is scored: its answer, at index
  L - 2Q + 1, is the target record; everything before it is the prompt (what follows it cannot
  influence the answer's prediction: attention is causal).
  The target record has depth d = (i + 0.5) / N for sample i of N: it sits at context offset
  round(d * (C - 1)). The other P - 1 records (distractors) are at uniformly random positions
  of the rest of the context; the other Q - 1 queries are drawn as in a training document.
  At every length the sample holds the same P records and Q queries; what grows with L is the
  filler and the distance from the query's key to the target record, distance = (L - 2Q) -
  (1 + round(d * (C - 1))), about (1 - d) * L. Sample i at length L comes from its own random
  stream (seed, "test", L, i), so every model is scored on the same samples.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, NamedTuple, Optional

import numpy as np

from rove_jax.tasks import recall_tasks
from rove_jax.tasks.recall_chars import (
  FILLER_CHARS,
  KEY_CHARS,
  RECORD_CHARS,
  char_ids,
  key_ids,
  record_ids,
)

TASKS = ("mqar", "lastwrite", "offset")
FORMAT = 3  # bump when the generator's output changes: it is part of the token-cache key
_STREAMS = {"train": 0, "val": 1, "test": 2}


@dataclasses.dataclass(frozen=True)
class RecallSpec:
  """The sizes of the recall corpus, written as the corpus path "seq_len=32,pairs=6,...".

  Attributes:
    seq_len: T, the training length: a document and its end-of-text are T tokens (must equal
      data.seq_len).
    pairs: P, records (key-value pairs, one token each) in a context.
    queries: queries after the context of a document (may exceed pairs: a key can be
      queried more than once).
    keys: size of the key alphabet ('0'.., at most 10; >= pairs).
    values: values a key can take: chance accuracy for a model that knows the key is
      1 / values (keys * values <= 52, the record alphabet).
    train_docs, val_docs: documents in the two splits.
    seed: the data seed (the run's config.seed only shuffles and initializes).
    answer_loss: 1: the training loss covers the query answers only (`loss_mask`); 0: every
      token. The documents are the same either way.
    task: "mqar", "lastwrite" (pairs = writes, which may exceed keys) or "offset" (pairs = 1
      marker, keys = the offsets 1..keys, values = the context alphabet): see
      rove_jax.tasks.recall_tasks.
  """

  seq_len: int = 32
  pairs: int = 6
  queries: int = 8
  keys: int = 6
  values: int = 8
  train_docs: int = 60000
  val_docs: int = 1000
  seed: int = 0
  answer_loss: int = 1
  task: str = "mqar"

  def __post_init__(self):
    if self.task not in TASKS:
      raise ValueError(f"recall spec: task must be one of {TASKS}, got {self.task!r}")
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name == "task":
        continue
      if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"recall spec: {f.name} must be an int, got {value!r}")
    low = {
      "pairs": 1,
      "queries": 1,
      "keys": 1,
      "values": 2,
      "train_docs": 1,
      "val_docs": 1,
      "seed": 0,
      "seq_len": 1,
      "answer_loss": 0,
    }
    for name, minimum in low.items():
      if getattr(self, name) < minimum:
        raise ValueError(f"recall spec: {name} must be >= {minimum}, got {getattr(self, name)}")
    if self.answer_loss > 1:
      raise ValueError(f"recall spec: answer_loss must be 0 or 1, got {self.answer_loss}")
    records = self.values if self.task == "offset" else self.keys * self.values
    if self.keys > len(KEY_CHARS) or records > len(RECORD_CHARS):
      raise ValueError(
        f"recall spec: keys must be <= {len(KEY_CHARS)} and keys * values "
        f"(task=offset: values) <= {len(RECORD_CHARS)} (the record alphabet), got "
        f"keys={self.keys}, values={self.values}"
      )
    if self.task == "mqar" and self.pairs > self.keys:
      raise ValueError(
        f"recall spec: pairs={self.pairs} needs as many distinct keys, but keys={self.keys}"
      )
    if self.context_len < self.pairs:
      raise ValueError(
        f"recall spec: seq_len={self.seq_len} leaves a context of "
        f"{self.context_len} tokens, too short for {self.pairs} records; need "
        f"seq_len >= {self.pairs + 2 * self.queries + 1}"
      )
    if self.task != "mqar":
      recall_tasks.check(self)

  @property
  def context_len(self) -> int:
    """C: context tokens of a training document."""
    return self.seq_len - 1 - 2 * self.queries

  @classmethod
  def parse(cls, text: Optional[str]) -> "RecallSpec":
    """A spec from "name=value,..." (None or "": the defaults); unknown names are errors."""
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {}
    for part in (text or "").split(","):
      if not part.strip():
        continue
      name, eq, value = part.partition("=")
      name = name.strip()
      if not eq or name not in fields:
        raise ValueError(
          f"recall corpus path {text!r}: {part!r} is not NAME=INT with NAME one of {sorted(fields)}"
        )
      if name == "task":
        kw[name] = value.strip()
        continue
      try:
        kw[name] = int(value)
      except ValueError:
        raise ValueError(
          f"recall corpus path {text!r}: {name} must be an int, got {value!r}"
        ) from None
    return cls(**kw)

  def to_string(self) -> str:
    """The canonical corpus path of this spec (every field)."""
    return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def _rng(*words: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([int(w) for w in words]))


def _contexts(
  rng: np.random.Generator,
  spec: RecallSpec,
  n_docs: int,
  context_len: int,
  n_records: int,
  extra_keys: int = 0,
):
  """Contexts [D, C] of uniform filler holding n_records records each at random positions.

  Returns:
    (tokens [D, C], keys [D, n_records + extra_keys] (key indices, distinct in a row; the extra
    ones are not in the context), records [D, n_records + extra_keys] (token ids, uniform
    values), record positions [D, n_records]).
  """
  tokens = char_ids(FILLER_CHARS)[rng.integers(0, len(FILLER_CHARS), (n_docs, context_len))]
  pos = np.argsort(rng.random((n_docs, context_len)), axis=1)[:, :n_records]
  keys = np.argsort(rng.random((n_docs, spec.keys)), axis=1)[:, : n_records + extra_keys]
  records = record_ids(spec)[keys, rng.integers(0, spec.values, keys.shape)]
  np.put_along_axis(tokens, pos, records[:, :n_records], axis=1)
  return tokens, keys, records, pos


def _with_queries(
  rng: np.random.Generator, spec: RecallSpec, ctx, keys, records, first: Optional[int] = None
) -> np.ndarray:
  """Context [D, C] + Q queries (key token, record) of records drawn uniformly and
  independently among the columns of keys / records; with `first`, the first query is that
  column."""
  q = rng.integers(0, keys.shape[1], (ctx.shape[0], spec.queries))
  if first is not None:
    q[:, 0] = first
  qa = np.stack(
    [key_ids(spec)[np.take_along_axis(keys, q, 1)], np.take_along_axis(records, q, 1)], axis=2
  )
  return np.concatenate([ctx, qa.reshape(ctx.shape[0], -1)], axis=1)


def loss_mask(spec: RecallSpec) -> Optional[np.ndarray]:
  """[T] int32, 1 at the targets that are query answers (None with answer_loss=0): window
  target t is document token t, and query q's answer is document token C + 2q + 1."""
  if not spec.answer_loss:
    return None
  mask = np.zeros(spec.seq_len, np.int32)
  mask[spec.context_len + 1 : spec.context_len + 2 * spec.queries : 2] = 1
  return mask


def training_tokens(
  spec: RecallSpec, split: str, n_docs: Optional[int] = None, start: int = 0
) -> np.ndarray:
  """Documents start .. start + n_docs - 1 of a split as token ids [D, T - 1].

  Documents are generated in blocks of 1000 from the stream (seed, split, block), so a
  document is the same whatever n_docs and start ask for it.
  """
  total = spec.train_docs if split == "train" else spec.val_docs
  n_docs = total - start if n_docs is None else n_docs
  out = []
  for block in range(start // 1000, (start + n_docs + 999) // 1000):
    rng = _rng(spec.seed, _STREAMS[split], block)
    if spec.task != "mqar":
      out.append(recall_tasks.documents_block(rng, spec, 1000))
      continue
    ctx, keys, records, _ = _contexts(rng, spec, 1000, spec.context_len, spec.pairs)
    out.append(_with_queries(rng, spec, ctx, keys, records))
  docs = np.concatenate(out)
  offset = start - (start // 1000) * 1000
  return docs[offset : offset + n_docs]


def documents(spec: RecallSpec, split: str) -> Iterator[str]:
  """The documents of a split as text (ASCII, one character a token; see the module
  docstring). The first document of each split has one extra leading filler token."""
  if split not in _STREAMS or split == "test":
    raise ValueError(f"unknown split {split!r}; expected 'train' or 'val'")
  total = spec.train_docs if split == "train" else spec.val_docs
  for start in range(0, total, 1000):
    docs = training_tokens(spec, split, min(1000, total - start), start)
    for i, row in enumerate(docs):
      text = row.astype(np.uint8).tobytes().decode("ascii")
      if start + i == 0:
        text = FILLER_CHARS[0] + text
      yield text


class Samples(NamedTuple):
  """Test samples at one length.

  Attributes:
    tokens: [N, L] int32: eot, then a document whose first query is scored.
    answer_index: the index of the scored answer in every row (L - 2Q + 1).
    distance: [N] the first query's key position minus the target record's position.
    depth: [N] the target pair's nominal depth in the context, (i + 0.5) / N.
  """

  tokens: np.ndarray
  answer_index: int
  distance: np.ndarray
  depth: np.ndarray


def test_samples(spec: RecallSpec, length: int, n: int, *, eot_id: int, seed: int = 0) -> Samples:
  """N test samples of exactly `length` tokens (see the module docstring).

  Args:
    spec: the corpus spec (alphabets, records and queries).
    length: L, tokens a sample (at least pairs + 2 * queries + 1).
    n: N, samples (depths (i + 0.5) / N).
    eot_id: the tokenizer's end-of-text id, the first token.
    seed: test-set seed; sample i comes from the stream (seed, test, L, i).

  Returns:
    `Samples`.
  """
  context_len = length - 1 - 2 * spec.queries
  if context_len < spec.pairs or n < 1:
    raise ValueError(
      f"a recall test sample of {spec.pairs} records and {spec.queries} queries "
      f"needs length >= {spec.pairs + 2 * spec.queries + 1} and n >= 1, got "
      f"length={length}, n={n}"
    )
  tokens = np.empty((n, length), np.int32)
  distance = np.empty(n, np.int64)
  depth = (np.arange(n) + 0.5) / n
  for i in range(n):
    rng = _rng(seed, _STREAMS["test"], length, i)
    if spec.task != "mqar":
      doc, at = recall_tasks.test_document(rng, spec, context_len, depth[i])
      tokens[i] = np.concatenate([[eot_id], doc])
      distance[i] = (length - 2 * spec.queries) - (1 + at)
      continue
    # The distractors: P - 1 records in a context one token short; then the target record,
    # whose key (the extra one) is not among theirs, goes in at its depth.
    ctx, keys, records, _ = _contexts(rng, spec, 1, context_len - 1, spec.pairs - 1, extra_keys=1)
    at = int(round(depth[i] * (context_len - 1)))
    ctx = np.insert(ctx, at, records[:, -1], axis=1)
    doc = _with_queries(rng, spec, ctx, keys, records, first=spec.pairs - 1)
    tokens[i] = np.concatenate([[eot_id], doc[0]])
    distance[i] = (length - 2 * spec.queries) - (1 + at)
  return Samples(tokens, length - 2 * spec.queries + 1, distance, depth)
