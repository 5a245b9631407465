"""The recall source's position-dependent tasks: the answer depends on order or distance, not
only on content (rove_jax.tasks.recall is the owner of the format; this module generates the
documents and test samples of `RecallSpec.task` "lastwrite" and "offset").

Shape letters as in rove_jax.tasks.recall: D documents, C context tokens, Q queries, K the key
alphabet, V the value alphabet.

Both tasks keep the recall layout: document = context (C = T - 1 - 2Q tokens) + Q queries x
(query token, answer token), the loss on the answers only, test samples = [eot] + a document
whose first query is scored, `distance` = the first query's position minus the answer's
position in the context.

lastwrite (variable tracking, last write wins): the context holds `pairs` writes among filler,
each a one-token record (key, value) at a random position; keys are uniform over the first
`keys` keys, and a key written again gets a value other than its previous one. A query names a
key written in the context (that of a uniformly drawn write) and its answer is the record of
the key's LAST write. When the queried key was written more than once, content alone does not
decide: a model has to prefer the later of the matching records. Test samples: the scored key is
written exactly twice, the answer (the second write) at depth d = (i + 0.5) / N of the context
and the overwritten one at a uniformly random position before it; the other writes use other
keys. A model that picks one of the two matching records at random is right half the time.

offset (the token k places after a marker): the context is uniform tokens of the value
alphabet ('A'.. , `values` of them) with one marker token (MARKER) at a random position m that
leaves room for the largest offset; a query is an offset digit k in 1..`keys` and its answer is
context token m + k. The marker is found by content, but the answer is the token at a fixed
distance from it: which one depends on relative position only. Test samples: the marker at
depth d (m = round(d * (C - 1 - K))), the first query's offset uniform. Chance is 1 / V.
"""

from __future__ import annotations

import numpy as np

from rove_jax.tasks import recall_chars as chars
from rove_jax.tasks.recall_chars import MARKER  # the offset task's marker


def offset_digit_ids(keys: int) -> np.ndarray:
  """The query tokens of offsets 1..keys: the digits '1'..str(keys) [K]."""
  return np.arange(ord("1"), ord("1") + keys, dtype=np.int32)


def check(spec) -> None:
  """Errors (ValueError) for specs a task cannot generate from."""
  if spec.task == "lastwrite":
    if spec.pairs < 2 or spec.keys < 2:
      raise ValueError(
        f"recall spec: task=lastwrite needs pairs >= 2 writes (a key written "
        f"twice) and keys >= 2 (other keys beside it), got pairs={spec.pairs}, "
        f"keys={spec.keys}"
      )
  elif spec.task == "offset":
    if spec.pairs != 1:
      raise ValueError(
        f"recall spec: task=offset has one marker a context: set pairs=1, got pairs={spec.pairs}"
      )
    if spec.keys > 9:
      raise ValueError(
        f"recall spec: task=offset takes offsets 1..keys as one digit each: keys "
        f"must be <= 9, got {spec.keys}"
      )
    if spec.context_len < spec.keys + 1:
      raise ValueError(
        f"recall spec: seq_len={spec.seq_len} leaves a context of "
        f"{spec.context_len} tokens, too short for a marker and {spec.keys} "
        f"tokens after it; need seq_len >= {spec.keys + 2 * spec.queries + 2}"
      )


def _filler(rng, context_len: int) -> np.ndarray:
  filler = chars.filler_ids()
  return filler[rng.integers(0, len(filler), context_len)]


def _lastwrite_doc(rng, spec, context_len: int, n_writes: int, target=None):
  """One lastwrite document's context and queries.

  With `target` (test samples): the scored key is written twice, its last write at context
  position `target`; returns (context [C], queries [Q, 2], the answer's position).
  """
  records = chars.record_ids(spec)
  ctx = _filler(rng, context_len)
  if target is None:
    pos = np.sort(rng.permutation(context_len)[:n_writes])
    keys = rng.integers(0, spec.keys, n_writes)
  else:
    old = int(rng.integers(0, target))
    rest = np.setdiff1d(np.arange(context_len), [old, target])
    pos = np.sort(np.concatenate([rng.permutation(rest)[: n_writes - 2], [old, target]]))
    t_key = int(rng.integers(0, spec.keys))
    others = np.setdiff1d(np.arange(spec.keys), [t_key])
    keys = others[rng.integers(0, len(others), n_writes)]
    keys[pos == old] = t_key
    keys[pos == target] = t_key
  last = {}
  for p, k in zip(pos, keys):
    v = int(rng.integers(0, spec.values))
    if k in last and v == last[k][1]:  # a rewrite changes the value
      v = (v + 1 + int(rng.integers(0, spec.values - 1))) % spec.values
    last[int(k)] = (int(p), v)
    ctx[p] = records[k, v]
  written = [int(k) for k in keys]
  q_keys = [written[i] for i in rng.integers(0, len(written), spec.queries)]
  if target is not None:
    q_keys[0] = t_key
  queries = np.array([[chars.key_ids(spec)[k], records[k, last[k][1]]] for k in q_keys], np.int32)
  return ctx, queries, (last[t_key][0] if target is not None else None)


def _offset_doc(rng, spec, context_len: int, marker=None):
  """One offset document's context and queries; with `marker` (test samples) the marker's
  position is given and the first query's answer position is returned too."""
  alphabet = chars.char_ids(chars.RECORD_CHARS[: spec.values])
  ctx = alphabet[rng.integers(0, spec.values, context_len)]
  m = int(rng.integers(0, context_len - spec.keys)) if marker is None else marker
  ctx[m] = ord(MARKER)
  ks = rng.integers(1, spec.keys + 1, spec.queries)
  queries = np.stack([offset_digit_ids(spec.keys)[ks - 1], ctx[m + ks]], axis=1)
  return ctx, queries.astype(np.int32), m + int(ks[0])


def documents_block(rng, spec, n_docs: int) -> np.ndarray:
  """n_docs training documents [D, T - 1] of the spec's task from one random stream."""
  out = np.empty((n_docs, spec.seq_len - 1), np.int32)
  for i in range(n_docs):
    if spec.task == "lastwrite":
      ctx, queries, _ = _lastwrite_doc(rng, spec, spec.context_len, spec.pairs)
    else:
      ctx, queries, _ = _offset_doc(rng, spec, spec.context_len)
    out[i] = np.concatenate([ctx, queries.reshape(-1)])
  return out


def test_document(rng, spec, context_len: int, depth: float) -> tuple[np.ndarray, int]:
  """One test document (context + queries) [C + 2Q] whose first query's answer sits at depth
  `depth` of the context, and that answer's context position."""
  if spec.task == "lastwrite":
    target = 1 + int(round(depth * (context_len - 2)))
    ctx, queries, at = _lastwrite_doc(rng, spec, context_len, spec.pairs, target=target)
  else:
    marker = int(round(depth * (context_len - 1 - spec.keys)))
    ctx, queries, at = _offset_doc(rng, spec, context_len, marker=marker)
  return np.concatenate([ctx, queries.reshape(-1)]), at
