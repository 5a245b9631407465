"""A run's data, opened on every process and confirmed to be the same data on all of them
before step 1.

Each process opens the data (`data.prepare`: a prepared dataset's shards checked against its
manifest at every start, see rove_jax.data.shard_check) and all of them exchange over jax's
collectives whether that worked and what they found (`Data.identity` without its "path": the
token streams' or the prepared manifest's digests). A process that failed, or one whose data is
not process 0's (another dataset at the same path, a copy that differs), stops every process at
the same point with one line naming the processes, instead of a run that trains on a mix. The
data is then checked against the run: enough of each split for a batch, packed rows the
attention kernel can take, the tokenizer's ids inside the model's vocabulary.
"""

from __future__ import annotations

import jax

from rove_jax import data as data_lib
from rove_jax.nn.model_config import padded_vocab_size
from rove_jax.train import agreement, packing
from rove_jax.train.run_config import RunConfig

_OK, _BAD_INPUT, _OTHER = "ok", "bad input", "other"


def open_data(c: RunConfig, workdir: str, *, resuming: bool, log=print) -> data_lib.Data:
  """The run's `Data`, the same on every process and fit for the run (see the module
  docstring).

  Args:
    c: the run config.
    workdir: the resolved workdir.
    resuming: a checkpoint will be restored; data.allow_changed then lets a changed prepared
      shard through with a warning (a new run always refuses one).

  Raises:
    ValueError: the data could not be opened (this process's own error), processes hold
      different data, or it does not fit the run; RuntimeError: another process failed
      otherwise.
  """
  nproc, pidx = jax.process_count(), jax.process_index()
  failure, data = None, None
  try:
    data = data_lib.prepare(
      c.data.corpus(),
      c.data.tokenizer,
      workdir=workdir,
      max_train_tokens=c.data.max_train_tokens,
      max_val_tokens=c.data.max_val_tokens,
      verify=True,
      allow_changed=c.data.allow_changed and resuming,
      process_index=pidx,
      process_count=nproc,
    )
  except Exception as e:  # noqa: BLE001 - raised below, once every process knows
    if nproc == 1:
      raise
    failure = e
  status = _OK if failure is None else _BAD_INPUT if isinstance(failure, ValueError) else _OTHER
  contents = None if data is None else {k: v for k, v in data.identity.items() if k != "path"}
  table = agreement.gather_json({"status": status, "identity": contents})
  if failure is not None:
    raise failure
  failed = [i for i, t in enumerate(table) if t["status"] != _OK]
  if failed:
    kind = ValueError if all(table[i]["status"] == _BAD_INPUT for i in failed) else RuntimeError
    raise kind(
      f"processes {failed} of {nproc} could not open the data "
      f"({c.data.source} at {c.data.path}): see their log; nothing was trained"
    )
  differ = [i for i, t in enumerate(table) if t["identity"] != table[0]["identity"]]
  if differ:
    first, mine = table[0]["identity"], table[differ[0]]["identity"]
    keys = sorted(k for k in set(first) | set(mine) if first.get(k) != mine.get(k))
    what = ", ".join(
      f"{k} {_short(mine.get(k))} where process 0 has {_short(first.get(k))}" for k in keys
    )
    raise ValueError(
      f"processes {differ} of {nproc} read other data than process 0 ({c.data.source} at "
      f"{c.data.path}; process {differ[0]}: {what}): training would mix them. Give every "
      f"process the same data (shared storage or identical copies); nothing was trained."
    )
  for split, toks in (("training", data.train_tokens), ("validation", data.val_tokens)):
    windows = (len(toks) - 1) // c.data.seq_len
    if windows < c.data.batch_size:  # found now, not when the first evaluation comes round
      raise ValueError(
        f"the {split} split has {len(toks)} tokens: {windows} windows of "
        f"data.seq_len={c.data.seq_len}, fewer than one batch of "
        f"data.batch_size={c.data.batch_size}; use more data (data.max_files, "
        f"data.val_fraction, data.val_path) or a smaller seq_len / batch_size"
      )
  if c.data.packing:  # rows the attention kernel cannot take stop the run here, not as NaN
    packing.check(
      c.model, c.data.seq_len, (data.train_tokens, data.val_tokens), data.tokenizer.eot_id, log=log
    )
  if data.tokenizer.vocab_size > c.model.vocab_size:
    need = padded_vocab_size(data.tokenizer.vocab_size)
    raise ValueError(
      f"tokenizer {data.tokenizer.name} has {data.tokenizer.vocab_size} ids but "
      f"model.vocab_size is {c.model.vocab_size}; set "
      f"--config.model.vocab_size={need}"
    )
  return data


def _short(value) -> str:
  return f"{value[:12]}..." if isinstance(value, str) and len(value) > 12 else repr(value)
