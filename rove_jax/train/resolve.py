"""What a run config leaves to its inputs, filled in before any work (`resolve`): a prepared
dataset's tokenizer and vocabulary size, and init_from's model and tokenizer.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Iterable, Optional

from rove_jax.nn.model_config import padded_vocab_size
from rove_jax.train import overrides
from rove_jax.train.run_config import DataConfig, RunConfig


def command_line(c: RunConfig, given: list, *, log=None) -> RunConfig:
  """A config file's RunConfig with a command line's overrides ([(key, value)]:
  overrides.split) applied, resolved. With init_from (the file's or an override's), the
  --config.model.* overrides apply to the checkpoint's model, not to the file's: a config
  file's model section is for a model trained from scratch, and the checkpoint decides its
  shapes (rove_jax.train.init_from, which refuses an override it does not allow). The
  overrides are applied at once, so fields that must agree (data.seq_len and model.max_len)
  may both change. One pass: the checkpoint is read once, the overrides applied once.
  """
  path = c.init_from
  for key, value in given:
    if key == "init_from" and value is not overrides.MISSING:
      path = overrides.parse(value, str, optional=True) if isinstance(value, str) else value
  pretrained = _read(path)
  model_given = {key.split(".")[1] for key, _ in given if key.startswith("model.")}
  if pretrained is not None:
    given = [("model", pretrained.model)] + list(given)
  c = overrides.apply(c, given)
  return _resolve(c, pretrained, model_given, log)


def resolve(c: RunConfig, *, log=None, model_given: Optional[Iterable[str]] = None) -> RunConfig:
  """`c` with what its inputs decide filled in, checked before any work.

  A prepared dataset (data.source=prepared) supplies its tokenizer when data.tokenizer is unset
  and raises model.vocab_size to fit its ids (`_prepared`); any other source reads bytes unless
  told otherwise. With init_from, the model is the checkpoint's and so is the tokenizer unless
  given (rove_jax.train.init_from); `model_given`
  names the model fields the user set (rove-train passes its --config.model.* overrides; None:
  every model field, compared with the checkpoint's). Resolving a resolved config returns an
  equal one.

  Raises:
    ValueError: one line naming the field or the file, before any work.
  """
  if not isinstance(c, RunConfig):
    raise TypeError(
      f"a run config is a rove_jax.train.RunConfig, got {type(c).__name__}: "
      f"build one in Python or load a config file with "
      f"rove_jax.train.overrides.load_file"
    )
  return _resolve(c, _read(c.init_from), model_given, log)


def _read(path: Optional[str]):
  """init_from's checkpoint (init_from.Pretrained), or None without one."""
  if path is None:
    return None
  from rove_jax.train import init_from  # safetensors: runs that start from a checkpoint

  return init_from.read(path)


def _resolve(c: RunConfig, pretrained, model_given: Optional[Iterable[str]], log) -> RunConfig:
  """`resolve`'s work, with init_from's checkpoint read already."""
  model, data = c.model, c.data
  if pretrained is not None:
    from rove_jax.train import init_from

    model, tokenizer = init_from.configure(pretrained, model, data.tokenizer, model_given, log=log)
    data = dataclasses.replace(data, tokenizer=tokenizer)
  if data.source == "prepared" and data.path:
    tokenizer, vocab_size = _prepared(data, model.vocab_size, dry_run=c.dry_run, log=log)
    data = dataclasses.replace(data, tokenizer=tokenizer)
    model = dataclasses.replace(model, vocab_size=vocab_size)
  if data.tokenizer is None and data.source != "prepared":
    data = dataclasses.replace(data, tokenizer="bytes")
  if (model, data) == (c.model, c.data):
    return c
  return dataclasses.replace(c, model=model, data=data)


def _prepared(data: DataConfig, vocab_size: int, *, dry_run: bool, log) -> tuple:
  """(tokenizer, vocabulary size) of a run on a prepared dataset: its tokenizer when
  data.tokenizer is unset, and with it a vocabulary large enough for its ids (rounded up to a
  multiple of 64); a tokenizer given that is not the dataset's is an error."""
  from rove_jax.data import prepared  # the data package loads grain

  try:
    manifest = prepared.read_manifest(data.path)
  except (ValueError, OSError) as e:
    if dry_run:  # a dry run compiles for a slice from a host that need not see the data
      return data.tokenizer, vocab_size
    raise ValueError(f"data.path={data.path}: {e}") from None
  want, given = manifest["tokenizer"], data.tokenizer
  if given is not None and given != want["spec"]:
    raise ValueError(
      f"data.tokenizer={given!r} but the prepared dataset {data.path} was "
      f"tokenized with {want['spec']!r}; leave data.tokenizer unset (the dataset "
      f"supplies it) or prepare the corpus again with {given!r}"
    )
  ids = int(want["vocab_size"])
  need = padded_vocab_size(ids)
  if vocab_size < ids:
    if given is not None:
      raise ValueError(
        f"model.vocab_size={vocab_size} is smaller than the {ids} ids of the "
        f"prepared dataset's tokenizer {want['spec']!r}; set "
        f"--config.model.vocab_size={need} or leave data.tokenizer unset"
      )
    (log or _log)(
      f"model.vocab_size={need}: the prepared dataset's tokenizer {want['spec']!r} has {ids} ids"
    )
    vocab_size = need
  return want["spec"], vocab_size


def _log(message: str) -> None:
  print(f"[rove_jax.train] {message}", file=sys.stderr, flush=True)
