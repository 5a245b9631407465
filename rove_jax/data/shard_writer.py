"""One split of a corpus tokenized into a prepared directory's shards (rove_jax.data.prepare_corpus
runs it for each split; the format: rove_jax.data.prepared_format).

`write_split` encodes the documents in batches of about 1 MiB of text, cuts the token stream
(eot_id after every document) into shards of tokens_per_shard tokens, writes each atomically
and records it in the split's progress entry `st` ({"shards", "tokens", "next_doc", "skip",
"done"}), calling save_state after each: where the next shard starts (document index, tokens
of it already written) is always on record, so a killed preparation goes on from there.
"""

from __future__ import annotations

import hashlib
import sys
from collections import deque
from typing import Iterable, Optional

import numpy as np

from rove_jax.data import prepared_format
from rove_jax.data.tokenization import Tokenizer
from rove_jax.storage import paths

_ENCODE_CHUNK_CHARS = 1 << 20  # texts handed to encode_batch at once


def write_split(
  docs: Iterable[str],
  tok: Tokenizer,
  out: str,
  split: str,
  st: dict,
  save_state,
  *,
  tokens_per_shard: int,
  cap: Optional[int],
  dtype: np.dtype,
  progress: bool,
  log,
) -> None:
  """Tokenizes one split from where st says it stopped, writing shards and updating st."""
  eot = np.array([tok.eot_id], dtype)
  resume_doc, resume_skip = st["next_doc"], st["skip"]
  buf, buf_len = [], 0
  flushed = st["tokens"]  # tokens in the shards written
  in_buf = deque()  # (document index, global offset of its first token) in buf
  bar = _bar(progress, split, cap, flushed)

  def emit(n):
    nonlocal buf, buf_len, flushed
    whole = np.concatenate(buf)
    shard, rest = whole[:n], whole[n:]
    buf, buf_len = [rest], rest.size
    entry = _write_shard(
      out, prepared_format.shard_name(split, len(st["shards"])), shard, tok.eot_id
    )
    flushed += n
    while len(in_buf) > 1 and in_buf[1][1] <= flushed:
      in_buf.popleft()
    if rest.size:  # the first unwritten token is in the last document starting before it
      while len(in_buf) > 1 and in_buf[1][1] <= flushed:
        in_buf.popleft()
      next_doc, skip = in_buf[0][0], flushed - in_buf[0][1]
    else:
      next_doc, skip = in_buf[-1][0] + 1, 0
      in_buf.clear()
    st["shards"].append(entry)
    st.update(tokens=flushed, next_doc=next_doc, skip=skip)
    save_state()

  def encode(pending):
    nonlocal buf_len
    for (i, _), ids in zip(pending, tok.encode_batch([d for _, d in pending])):
      arr = np.concatenate([ids.astype(dtype), eot])
      start = flushed + buf_len
      if i == resume_doc and resume_skip:
        arr, start = arr[resume_skip:], start - resume_skip
      in_buf.append((i, start))
      buf.append(arr)
      buf_len += arr.size
      if bar is not None:
        bar.update(arr.size)

  pending, chars, stop = [], 0, False
  for i, doc in enumerate(docs):
    if i < resume_doc:
      continue
    pending.append((i, doc))
    chars += len(doc)
    if chars < _ENCODE_CHUNK_CHARS:
      continue
    encode(pending)
    pending, chars = [], 0
    stop = cap is not None and flushed + buf_len >= cap
    if stop:
      break
    while buf_len >= tokens_per_shard:
      emit(tokens_per_shard)
  if pending and not stop:
    encode(pending)
  if cap is not None and flushed + buf_len > cap:  # cut at exactly cap tokens
    whole = np.concatenate(buf)[: cap - flushed]
    buf, buf_len = [whole], whole.size
  while buf_len >= tokens_per_shard:
    emit(tokens_per_shard)
  if buf_len:
    emit(buf_len)
  if bar is not None:
    bar.close()
  st["done"] = True
  save_state()


def _write_shard(out: str, name: str, tokens: np.ndarray, eot_id: int) -> dict:
  data = np.ascontiguousarray(tokens).tobytes()
  paths.write_atomic(paths.join(out, name), data)
  return {
    "file": name,
    "tokens": int(tokens.size),
    "documents": int(np.count_nonzero(tokens == eot_id)),
    "bytes": len(data),
    "sha256": hashlib.sha256(data).hexdigest(),
  }


def _bar(enabled: bool, split: str, cap, initial: int):
  if not enabled:
    return None
  try:
    from tqdm import tqdm
  except ImportError:
    return None
  return tqdm(
    total=cap,
    initial=initial,
    desc=f"tokenizing {split}",
    unit="tok",
    unit_scale=True,
    dynamic_ncols=True,
    file=sys.stderr,
  )
