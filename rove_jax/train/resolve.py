"""What a run config leaves to its inputs, filled in before any work (`resolve`): a prepared
dataset's tokenizer and vocabulary size, and init_from's model and tokenizer.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

from rove_jax.storage import deadline
from rove_jax.train import overrides
from rove_jax.train.run_config import RunConfig


def command_line(c: RunConfig, given: list, *, log=None) -> RunConfig:
  """A config file's RunConfig with a command line's overrides ([(key, value)]:
  overrides.split) applied, resolved. With init_from (the file's or an override's), the
  --config.model.* overrides apply to the checkpoint's model, not to the file's: a config
  file's model section is for a model trained from scratch, and the checkpoint decides its
  shapes (rove_jax.train.init_from, which refuses an override it does not allow). The
  overrides are applied at once, so fields that must agree (data.seq_len and model.max_len)
  may both change. One pass: the checkpoint is read once, the overrides applied once.
  """
  model_given = {key.split(".")[1] for key, _ in given if key.startswith("model.")}
  return _resolve(c, list(given), model_given, log)


def resolve(c: RunConfig, *, log=None, model_given: Optional[Iterable[str]] = None) -> RunConfig:
  """`c` with what its inputs decide filled in, checked before any work.

  A prepared dataset (data.source=prepared) supplies its tokenizer when data.tokenizer is unset
  and raises model.vocab_size to fit its ids (rove_jax.data.prepared.run_vocabulary); any other
  source reads bytes unless told otherwise. With init_from, the model is the checkpoint's and so
  is the tokenizer unless given (rove_jax.train.init_from); `model_given` names the model fields
  the user set (rove-train passes its --config.model.* overrides; None: every model field,
  compared with the checkpoint's). Resolving a resolved config returns an equal one.

  The reads run under c.storage_timeout, which stays this process's storage deadline for the
  run that follows (rove_jax.storage.deadline.configure: a stop or a storage failure of an
  earlier run in this process is forgotten).

  Raises:
    ValueError: one line naming the field or the file, before any work.
  """
  if not isinstance(c, RunConfig):
    raise TypeError(
      f"a run config is a rove_jax.train.RunConfig, got {type(c).__name__}: "
      f"build one in Python or load a config file with "
      f"rove_jax.train.overrides.load_file"
    )
  return _resolve(c, None, model_given, log)


def resolved(c: RunConfig, what: str) -> RunConfig:
  """`c`, given to `what` as one `resolve` returned (its inputs not read again): checked by
  what resolve always fills in, the tokenizer. Raises ValueError naming the fix."""
  if not isinstance(c, RunConfig) or c.data.tokenizer is None:
    raise ValueError(
      f"{what}(resolved=True) takes a config as rove_jax.train.resolve.resolve returned it; "
      f"this one has no data.tokenizer: resolve it first, or leave resolved unset"
    )
  return c


def _resolve(c: RunConfig, given: Optional[list], model_given, log) -> RunConfig:
  """The one body of `command_line` (`given`: its overrides) and `resolve` (None: `c` as it
  is): the storage deadline set, init_from's checkpoint read, the overrides applied, then what
  the checkpoint and a prepared dataset decide, in that order, each module called once."""
  # what the reads below need comes first: the checkpoint's path and the storage deadline
  path, timeout = c.init_from, c.storage_timeout
  for key, value in given or ():
    if value is overrides.MISSING:  # no value: apply names it below
      continue
    if key == "init_from":
      path = overrides.field_value(key, value)
    elif key == "storage_timeout":
      timeout = overrides.field_value(key, value)
  deadline.configure(timeout)  # the run's deadline, from its first read on
  if path is not None:
    from rove_jax.nn import pretrained as pretrained_lib  # only runs that start from one
    from rove_jax.train import init_from

    pretrained = pretrained_lib.inspect(path, where=f"init_from={path}", check=True)
  if given is not None:
    c = overrides.apply(c, ([("model", pretrained.model)] if path is not None else []) + given)
  model, data = c.model, c.data
  if path is not None:
    model, tokenizer = init_from.configure(pretrained, model, data.tokenizer, model_given, log=log)
    data = dataclasses.replace(data, tokenizer=tokenizer)
  if data.source == "prepared" and data.path:
    from rove_jax.data import prepared  # the data package loads grain

    tokenizer, vocab_size = prepared.run_vocabulary(
      data.path, data.tokenizer, model.vocab_size, dry_run=c.dry_run, log=log
    )
    data = dataclasses.replace(data, tokenizer=tokenizer)
    model = dataclasses.replace(model, vocab_size=vocab_size)
  if data.tokenizer is None and data.source != "prepared":
    data = dataclasses.replace(data, tokenizer="bytes")
  if (model, data) == (c.model, c.data):
    return c
  return dataclasses.replace(c, model=model, data=data)
