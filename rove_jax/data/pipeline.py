"""Token arrays -> batches: the resumable grain training iterator, evaluation batches, and
`prepare`, which builds a run's tokenizer and token arrays in its workdir.

A window is tokens[i*T : i*T + W] (so consecutive windows share one token and every token is a
target once); a batch is a dict of int32 arrays: inputs [B, T] = window[:-1], targets [B, T] =
window[1:] and, with packing=True, segment_ids [B, T] (the number of end-of-text tokens before
each input in its row: a new document starts after each one) and positions [B, T] (restarting
at 0 in each document, and at the start of the row). A source whose windows have a fixed layout
can weight the targets (`Data.loss_mask_T`, from `sources.loss_mask`: the recall source's
answers): the batches then also hold loss_mask [B, T], 1 where a target counts in the loss.

Resuming: the training iterator's state (`get_state()`, JSON-serializable) counts global steps,
so restoring it with `set_state` replays exactly the batches the run would have seen, even with
a different process_count. The state also records seq_len, global_batch_size, seed and packing,
and `set_state` refuses a state written by a different pipeline.

Data identity: `Data.identity` (a small JSON-serialisable dict) is equal for the same token
streams and differs whenever they differ, so a resumed run can tell that its data changed
under it; rove_jax.data.identity says what it holds, and its `describe_identity_change` (also
this module's) what changed, in words.

The workdir (token cache, bpe tokenizer file) may be local or gs://bucket/path.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Iterator, Optional

import grain
import numpy as np

from rove_jax.data import prepared, tokenization
from rove_jax.data.identity import describe_identity_change  # noqa: F401 - also this module's
from rove_jax.data.sources import Corpus, iter_documents, loss_mask, take_chars
from rove_jax.data.token_cache import load_tokens_and_sha256
from rove_jax.data.tokenization import Tokenizer
from rove_jax.storage import paths


def train_iterator(
  tokens,
  *,
  seq_len: int,
  global_batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  packing: bool = False,
  eot_id: Optional[int] = None,
  num_threads: int = 2,
  loss_mask_T: Optional[np.ndarray] = None,
) -> grain.DatasetIterator:
  """An endless, shuffled, checkpointable iterator of this process's training batches.

  Windows (see the module docstring) are shuffled with seed and every epoch is reshuffled.
  Global step s takes the next global_batch_size shuffled windows; process p gets rows
  [p*B, (p+1)*B) of them and reads only those.

  Args:
    tokens: [N] flat token array (e.g. from `load_tokens`; a `prepared.ShardedTokens` is read
      only where sliced), N >= seq_len + 1.
    seq_len: T, tokens per row.
    global_batch_size: rows per step over all processes (divisible by process_count).
    seed: shuffle seed, an int in [0, 2**32).
    process_index, process_count: this process and how many read the data
      (jax.process_index(), jax.process_count()).
    packing: also return segment_ids and positions (needs eot_id).
    eot_id: the tokenizer's end-of-text id.
    num_threads: grain reader threads prefetching batches.
    loss_mask_T: [T] 0/1 per target position, the same for every window (None: none).

  Returns:
    a grain `DatasetIterator` of dicts of int32 arrays: inputs [B, T], targets [B, T]
    (+ segment_ids [B, T], positions [B, T] with packing; + loss_mask [B, T] with loss_mask_T).
    get_state() / set_state() resume it.
  """
  tokens = _check_tokens(tokens, seq_len)
  lo, hi = _process_rows(global_batch_size, process_index, process_count)
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
    raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
  _check_packing(packing, eot_id)
  loss_mask_T = _check_loss_mask(loss_mask_T, seq_len)
  n_windows = (tokens.size - 1) // seq_len
  # grain reseeds epoch e with seed + e, so seeds 0 and 1 would share shuffles one epoch
  # apart; hashing the user's seed first decorrelates neighbouring seeds.
  shuffle_seed = int.from_bytes(
    hashlib.sha256(f"rove_jax/{int(seed)}".encode()).digest()[:4], "big"
  )
  ds = grain.MapDataset.range(n_windows).shuffle(seed=shuffle_seed).repeat()
  ds = ds.batch(global_batch_size, drop_remainder=True)  # batches of window indices
  ds = ds.map(_WindowBatch(tokens, seq_len, lo, hi, packing, eot_id, loss_mask_T))
  read = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=max(2, 2 * num_threads))
  inner = iter(ds.to_iter_dataset(read))
  pipeline = {
    "seq_len": int(seq_len),
    "global_batch_size": int(global_batch_size),
    "seed": int(seed),
    "packing": bool(packing),
    "n_windows": int(n_windows),
  }
  return _CheckedIterator(inner, pipeline)


class _WindowBatch:
  """Maps the global batch of window indices of a step to this process's batch dict."""

  def __init__(self, tokens, seq_len, lo, hi, packing, eot_id, loss_mask_T):
    self.tokens, self.seq_len, self.lo, self.hi = tokens, seq_len, lo, hi
    self.packing, self.eot_id, self.loss_mask_T = packing, eot_id, loss_mask_T

  def __call__(self, window_ids: np.ndarray) -> dict[str, np.ndarray]:
    starts_B = np.asarray(window_ids[self.lo : self.hi], dtype=np.int64) * self.seq_len
    return make_batch(
      _gather(self.tokens, starts_B, self.seq_len + 1),
      packing=self.packing,
      eot_id=self.eot_id,
      loss_mask_T=self.loss_mask_T,
    )


class _CheckedIterator(grain.DatasetIterator):
  """grain's iterator, with a state that also records (and checks) the pipeline settings."""

  def __init__(self, inner: grain.DatasetIterator, pipeline: dict[str, Any]):
    super().__init__(inner)
    self._inner = inner
    self._pipeline = pipeline

  def __next__(self):
    return next(self._inner)

  def get_state(self) -> dict[str, Any]:
    return {"grain": self._inner.get_state(), "pipeline": dict(self._pipeline)}

  def set_state(self, state: dict[str, Any]) -> None:
    if not isinstance(state, dict) or "grain" not in state or "pipeline" not in state:
      raise ValueError(
        "not a rove_jax data-iterator state (expected keys 'grain' and "
        f"'pipeline'), got {type(state).__name__} "
        f"{sorted(state) if isinstance(state, dict) else ''}"
      )
    saved = state["pipeline"]
    diffs = [
      f"{k}: saved {saved.get(k)!r}, now {v!r}"
      for k, v in self._pipeline.items()
      if saved.get(k) != v
    ]
    if diffs:
      raise ValueError(
        "the saved data-iterator state belongs to a different pipeline ("
        + "; ".join(diffs)
        + "); resume with the same data settings or start "
        "a fresh run"
      )
    self._inner.set_state(state["grain"])

  def __str__(self) -> str:
    return f"rove_jax.data.train_iterator({self._pipeline})"


def eval_batches(
  tokens,
  *,
  seq_len: int,
  batch_size: int,
  max_batches: Optional[int] = None,
  process_index: int = 0,
  process_count: int = 1,
  packing: bool = False,
  eot_id: Optional[int] = None,
  loss_mask_T: Optional[np.ndarray] = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Deterministic evaluation batches: windows in order, no shuffle, a partial last batch
  dropped.

  Args:
    tokens: [N] flat validation tokens.
    seq_len: T.
    batch_size: global rows per batch (divisible by process_count); each process yields its
      rows [p*B, (p+1)*B) as in `train_iterator`.
    max_batches: stop after this many batches (None: all full batches).
    packing, eot_id, loss_mask_T: as in `train_iterator`.

  Returns:
    an iterator of batch dicts (see `train_iterator`); always the same ones for the same args.
  """
  tokens = _check_tokens(tokens, seq_len)
  lo, hi = _process_rows(batch_size, process_index, process_count)
  _check_packing(packing, eot_id)
  loss_mask_T = _check_loss_mask(loss_mask_T, seq_len)
  if max_batches is not None and (
    isinstance(max_batches, bool)
    or not isinstance(max_batches, (int, np.integer))
    or max_batches < 1
  ):
    raise ValueError(f"max_batches must be a positive int or None, got {max_batches!r}")
  n_windows = (tokens.size - 1) // seq_len
  n_batches = n_windows // batch_size
  if n_batches == 0:
    raise ValueError(
      f"{tokens.size} validation tokens make {n_windows} windows of seq_len={seq_len}, fewer "
      f"than batch_size={batch_size}: lower batch_size or seq_len, or hold out more data"
    )
  if max_batches is not None:
    n_batches = min(n_batches, int(max_batches))

  def batches():
    for b in range(n_batches):
      starts_B = (b * batch_size + np.arange(lo, hi, dtype=np.int64)) * seq_len
      yield make_batch(
        _gather(tokens, starts_B, seq_len + 1),
        packing=packing,
        eot_id=eot_id,
        loss_mask_T=loss_mask_T,
      )

  return batches()


def make_batch(
  windows_BW,
  *,
  packing: bool = False,
  eot_id: Optional[int] = None,
  loss_mask_T: Optional[np.ndarray] = None,
) -> dict[str, np.ndarray]:
  """Splits windows [B, T + 1] into inputs/targets (+ segment_ids/positions with packing,
  + loss_mask with loss_mask_T).

  Args:
    windows_BW: [B, W] token windows, W = T + 1.
    packing: also return segment_ids and positions (see the module docstring).
    eot_id: the end-of-text id that separates documents (needed with packing).
    loss_mask_T: [T] 0/1, which target positions count in the loss (every row the same).

  Returns:
    a dict of int32 arrays [B, T]: inputs, targets (+ segment_ids, positions; + loss_mask).
  """
  windows_BW = np.asarray(windows_BW, dtype=np.int32)
  batch = {"inputs": windows_BW[:, :-1], "targets": windows_BW[:, 1:]}
  if packing:
    inputs_BT = batch["inputs"]
    eot_BT = (inputs_BT == eot_id).astype(np.int32)
    # Exclusive cumsum: a token's segment counts the end-of-text tokens strictly before it.
    batch["segment_ids"] = (np.cumsum(eot_BT, axis=1) - eot_BT).astype(np.int32)
    t_T = np.arange(inputs_BT.shape[1], dtype=np.int32)
    after_eot_BT = np.zeros_like(inputs_BT)
    after_eot_BT[:, 1:] = np.where(eot_BT[:, :-1] == 1, t_T[None, 1:], 0)
    start_BT = np.maximum.accumulate(after_eot_BT, axis=1)  # where each token's document began
    batch["positions"] = (t_T[None, :] - start_BT).astype(np.int32)
  if loss_mask_T is not None:
    batch["loss_mask"] = np.repeat(
      np.asarray(loss_mask_T, np.int32)[None], windows_BW.shape[0], axis=0
    )
  return batch


def max_documents(tokens, seq_len: int, eot_id: int, *, chunk_windows: int = 1 << 14) -> int:
  """The most documents any window's inputs hold with packing (its segment_ids' distinct
  values: one plus the end-of-text tokens among inputs[:-1]), over every window of `tokens`
  the iterators can yield; 0 for no window. Reads the tokens once, `chunk_windows` windows at
  a time (a memmap stays on disk)."""
  tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
  n_windows = max(0, (tokens.size - 1) // seq_len)
  most = 0
  for w in range(0, n_windows, chunk_windows):
    n = min(chunk_windows, n_windows - w)
    rows = np.asarray(tokens[w * seq_len : (w + n) * seq_len]).reshape(n, seq_len)
    most = max(most, 1 + int(np.max(np.sum(rows[:, :-1] == eot_id, axis=1))))
  return most


def _gather(tokens, starts_B: np.ndarray, width: int) -> np.ndarray:
  # One contiguous slice per row: cheap on a memmap, reads only these rows' pages.
  return np.stack([np.asarray(tokens[s : s + width], dtype=np.int32) for s in starts_B.tolist()])


def _check_tokens(tokens, seq_len) -> np.ndarray:
  if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
    raise ValueError(f"seq_len must be a positive int, got seq_len={seq_len!r}")
  if not isinstance(tokens, (np.ndarray, prepared.ShardedTokens)):  # shards: read when sliced
    tokens = np.asarray(tokens)
  if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"tokens must be a flat integer array [N], got {tokens.dtype} {tokens.shape}")
  if tokens.size < seq_len + 1:
    raise ValueError(
      f"{tokens.size} tokens cannot fill one window of seq_len + 1 = "
      f"{seq_len + 1}; lower seq_len or use more data"
    )
  return tokens


def _process_rows(global_batch_size, process_index, process_count) -> tuple[int, int]:
  for name, value, low in (
    ("global_batch_size", global_batch_size, 1),
    ("process_count", process_count, 1),
    ("process_index", process_index, 0),
  ):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
  if not process_index < process_count:
    raise ValueError(f"process_index={process_index} must be < process_count={process_count}")
  if global_batch_size % process_count:
    raise ValueError(
      f"global_batch_size={global_batch_size} is not divisible by process_count="
      f"{process_count}; use a multiple of {process_count}"
    )
  per_process = global_batch_size // process_count
  return process_index * per_process, (process_index + 1) * per_process


def _check_loss_mask(loss_mask_T, seq_len) -> Optional[np.ndarray]:
  if loss_mask_T is None:
    return None
  mask = np.asarray(loss_mask_T)
  if mask.shape != (seq_len,) or not np.isin(mask, (0, 1)).all() or not mask.any():
    raise ValueError(
      f"loss_mask_T must be [seq_len={seq_len}] zeros and ones, not all zero; "
      f"got shape {mask.shape}"
    )
  return mask.astype(np.int32)


def _check_packing(packing, eot_id) -> None:
  if packing and eot_id is None:
    raise ValueError(
      "packing=True needs eot_id (the tokenizer's end-of-text id) to find document boundaries"
    )


# ---------------------------------------------------------------------------------- prepare


@dataclasses.dataclass(frozen=True, eq=False)
class Data:
  """A run's tokenizer and token arrays, from `prepare`; loss_mask_T: the corpus's
  `sources.loss_mask` (None for most sources), which the batches then carry; identity: what
  the token streams are (see the module docstring; compare two with
  `describe_identity_change`)."""

  tokenizer: Tokenizer
  train_tokens: np.ndarray
  val_tokens: np.ndarray
  loss_mask_T: Optional[np.ndarray] = None
  identity: dict = dataclasses.field(default_factory=dict)

  def train_iterator(self, **kwargs) -> grain.DatasetIterator:
    """`train_iterator(self.train_tokens, eot_id=tokenizer.eot_id, loss_mask_T=..., **kwargs)`."""
    return train_iterator(
      self.train_tokens, eot_id=self.tokenizer.eot_id, loss_mask_T=self.loss_mask_T, **kwargs
    )

  def eval_batches(self, **kwargs) -> Iterator[dict[str, np.ndarray]]:
    """`eval_batches(self.val_tokens, eot_id=tokenizer.eot_id, loss_mask_T=..., **kwargs)`."""
    return eval_batches(
      self.val_tokens, eot_id=self.tokenizer.eot_id, loss_mask_T=self.loss_mask_T, **kwargs
    )


def prepare(
  corpus: Corpus,
  tokenizer: str = "bytes",
  *,
  workdir: str,
  vocab_size: Optional[int] = None,
  max_train_tokens: Optional[int] = None,
  max_val_tokens: Optional[int] = None,
  bpe_train_chars: int = 1_000_000_000,
  verify: bool = True,
  allow_changed: bool = False,
  process_index: int = 0,
  process_count: int = 1,
) -> Data:
  """Builds (or reloads from workdir) a run's tokenizer and train/val token arrays.

  Args:
    corpus: the `Corpus`.
    tokenizer: a `tokenization.get_tokenizer` spec; "bpe" trains on the train split once and
      keeps the file in workdir.
    workdir: the run directory, local or gs://; tokens are cached in workdir/data.
    vocab_size: for "bpe".
    max_train_tokens, max_val_tokens: caps (see `load_tokens`).
    bpe_train_chars: BPE training reads at most this many characters of training text.
    verify, allow_changed, process_index, process_count: a "prepared" corpus only
      (`prepared.for_run`): check its shards against the manifest first (hashing only those
      not hashed on this machine since they last changed); allow_changed: a mismatch is a
      warning, not an error.

  Returns:
    `Data`; call data.train_iterator(seq_len=..., global_batch_size=..., seed=...) and
    data.eval_batches(seq_len=..., batch_size=...); data.identity names the token streams.
  """
  workdir = paths.resolve(workdir, what="workdir")
  if corpus.source == "prepared":  # tokenized already: read from its shards
    tok, train, val, identity = prepared.for_run(
      corpus.path,
      tokenizer,
      workdir=workdir,
      verify_shards=verify,
      allow_changed=allow_changed,
      process_index=process_index,
      process_count=process_count,
      max_train_tokens=max_train_tokens,
      max_val_tokens=max_val_tokens,
    )
    return Data(tok, train, val, None, identity)
  tok = tokenization.get_tokenizer(
    tokenizer,
    workdir=workdir,
    vocab_size=vocab_size,
    train_texts=lambda: take_chars(iter_documents(corpus, "train"), bpe_train_chars),
  )
  cache_dir = paths.join(workdir, "data")
  train, train_sha = load_tokens_and_sha256(
    corpus, "train", tok, cache_dir=cache_dir, max_tokens=max_train_tokens
  )
  val, val_sha = load_tokens_and_sha256(
    corpus, "val", tok, cache_dir=cache_dir, max_tokens=max_val_tokens
  )
  identity = {"source": corpus.source, "train_sha256": train_sha, "val_sha256": val_sha}
  return Data(tok, train, val, loss_mask(corpus), identity)
