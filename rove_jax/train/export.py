"""Exports the newest verified checkpoint of a training workdir for inference (the rove-export
command, rove_jax.cli.export, drives `export_run`).

`export_run` reads the newest checkpoint whose checksums verify with its model config and
tokenizer (`run_reader.load_for_inference`, as rove-eval does: read-only, an unreadable
checkpoint is reported and the previous one taken) and writes its parameters with
`rove_jax.nn.pretrained.save`: a transformers GPT-2 checkpoint for a GPT-2-shaped model
(learned positions), otherwise rove-jax's own safetensors + config.json (its keys in
rove_jax.nn.pretrained's docstring). `rove_jax.nn.pretrained.load(out)`
returns (GPTConfig, params) ready for `rove_jax.nn.model.generate`. The config.json also records
the run it came from under "rove_jax_run": the step, the workdir's name, the training length
and the tokenizer metadata (spec, vocabulary size, end-of-text id, fingerprint), since the ids
mean nothing without the tokenizer; the end-of-text id also becomes GPT-2's
bos/eos_token_id. A tokenizer that is a file (bpe, a tokenizer.json) is written beside the
weights as tokenizer.json; the byte tokenizer and tiktoken's are named by their spec.

`load(out)` reads an export back as an `Exported`: the model, and the tokenizer that encodes a
prompt and decodes `generate`'s ids (`Exported.generate` does both).

--out is a local directory or gs://bucket/path (rove_jax.storage.paths). It is checked before
the checkpoint is read: not an existing file, not already holding an export (unless
--overwrite), and writable (a probe file is written and removed; a directory this check
created is removed again when the export then fails). The files are written weights first and
config.json last, each replaced whole; config.json is what makes a directory an export, so an
--overwrite removes the old one first, and a write that fails (a full disk) removes the files
it wrote: what is left is never taken for a finished export.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import uuid
from typing import Any, Optional

import jax
import numpy as np

from rove_jax import scaling
from rove_jax.data import tokenization
from rove_jax.nn import decoding, param_files, pretrained
from rove_jax.nn.model_config import GPTConfig
from rove_jax.storage import paths
from rove_jax.train import run_reader

TOKENIZER_FILE = pretrained.TOKENIZER_FILE


def _missing_parents(path: str) -> list:
  """The directories `os.makedirs(path)` would create, deepest first."""
  out = []
  while path and not os.path.lexists(path):
    out.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return out


def check_out_dir(out_dir: str) -> list:
  """Creates out_dir (local) and proves it writable by writing and removing a probe file;
  returns the local directories it created, deepest first (for removal if the export fails).

  Raises:
    OSError: out_dir is an existing file, or cannot be created or written (the message says
      which and what to do).
  """
  if paths.isfile(out_dir):
    raise NotADirectoryError(
      f"--out {out_dir} is an existing file, not a directory; give a directory for the export"
    )
  created = [] if paths.is_remote(out_dir) else _missing_parents(out_dir)
  probe = paths.join(out_dir, f".rove-export-write-test-{uuid.uuid4().hex[:12]}")
  try:
    paths.makedirs(out_dir)
    paths.write_atomic(probe, b"")
    paths.remove(probe)
  except Exception as e:  # noqa: BLE001 -- OSError or a storage library's own error
    if not (isinstance(e, OSError) or paths.is_storage_error(e)):
      raise
    _remove_empty(created)
    raise OSError(
      f"cannot create or write the export directory {out_dir} "
      f"({_cause(e, out_dir)}); {_fix(e, 'give a writable --out')}"
    ) from None
  return created


def _remove_empty(directories) -> None:
  """Removes the given local directories, deepest first, as long as they are empty."""
  for d in directories:
    try:
      os.rmdir(d)
    except OSError:
      return


def export_run(
  workdir: str, out_dir: str, *, format: str = "auto", overwrite: bool = False, report=print
) -> dict:
  """Writes the newest verified checkpoint of `workdir` to `out_dir` (each local or gs://).

  Returns:
    {"step", "format", "config", "weights"}: what was written.

  Raises:
    ValueError: an unknown format or URL scheme, a workdir that does not exist, no readable
      checkpoint, a model the format cannot hold, or an out_dir that already holds an export
      (without overwrite), all before writing.
    OSError: out_dir is a file or not writable (checked before the checkpoint is read), or the
      write failed (a full disk, a storage error): one message naming out_dir and the cause;
      out_dir then holds no export (`_write`), and is removed where this call created it.
    paths.MissingExtra (an ImportError): a gs:// path without gcsfs.
  """
  if format not in pretrained.FORMATS:  # checked again, with the model, by resolve_format
    raise ValueError(f"unknown export format {format!r}; expected one of {pretrained.FORMATS}")
  workdir = paths.resolve(workdir, what="--workdir")
  out_dir = paths.resolve(out_dir, what="--out")
  if not paths.isdir(workdir):
    raise ValueError(
      f"--workdir {workdir} "
      f"{'is not a directory' if paths.exists(workdir) else 'does not exist'}; "
      f"give the --workdir of a training run"
    )
  existing = [
    f for f in (param_files.CONFIG, param_files.WEIGHTS) if paths.exists(paths.join(out_dir, f))
  ]
  if existing and not overwrite:
    raise ValueError(
      f"{out_dir} already holds {', '.join(existing)}; choose another --out or pass --overwrite"
    )
  created = check_out_dir(out_dir)  # before the checkpoint read, which can take minutes
  try:
    restored = run_reader.load_for_inference(workdir, report=report)
    step, config, params = restored.step, restored.model_config, restored.params
    format = pretrained.resolve_format(config, format)
    tokenizer = dict(restored.meta["tokenizer"])
    tokenizer_json = None
    if isinstance(restored.tokenizer, tokenization.HFTokenizer):
      tokenizer_json = restored.tokenizer.to_json().encode("utf-8")
      tokenizer["file"] = TOKENIZER_FILE
    run = {"step": step, "tokenizer": tokenizer, "workdir": paths.basename(workdir)}
    if restored.train_len is not None:
      run["train_len"] = restored.train_len
    extra = {"rove_jax_run": run}
    if tokenizer.get("eot_id") is not None and format != "rove_jax":  # transformers' formats
      extra["bos_token_id"] = extra["eos_token_id"] = int(tokenizer["eot_id"])
    written = _write(
      out_dir,
      tokenizer_json,
      lambda: pretrained.save(out_dir, config, params, format=format, extra_config=extra),
    )
  except BaseException:
    _remove_empty(created)  # only directories this call made, and only while still empty
    raise
  return {"step": int(step), **written}


def _write(out_dir: str, tokenizer_json: Optional[bytes], save) -> dict:
  """Writes an export into out_dir: tokenizer.json (when given), then `save()` (the weights,
  then config.json); returns what `save` returns.

  config.json marks a finished export (`load` needs it), so one already there (--overwrite) is
  removed before anything is written: a failure part way never leaves new weights beside an
  old config.json. On a failure the export's files in out_dir are removed again.

  Raises:
    OSError: one message naming out_dir, the cause and what is left there (storage errors
      included).
  """
  names = [param_files.CONFIG, param_files.WEIGHTS] + ([TOKENIZER_FILE] if tokenizer_json else [])
  started = False
  try:
    paths.remove(paths.join(out_dir, param_files.CONFIG))
    started = True
    if tokenizer_json is not None:
      paths.write_atomic(paths.join(out_dir, TOKENIZER_FILE), tokenizer_json)
    return save()
  except BaseException as e:
    if started:
      for name in names:
        try:
          paths.remove(paths.join(out_dir, name))
        except Exception:  # noqa: BLE001 -- best effort: without config.json it is no export
          pass
    if not (isinstance(e, OSError) or paths.is_storage_error(e)):
      raise
    raise _write_failure(e, out_dir, started) from None


def _full(e: BaseException) -> bool:
  return getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)


def _cause(e: BaseException, out_dir: str) -> str:
  """Why a write into out_dir failed; a full disk with the errno's name ("No space left on
  device (ENOSPC)"), which is what a search for the failure finds."""
  cause = paths.describe_failure(e, out_dir)
  return f"{cause} ({errno.errorcode[e.errno]})" if _full(e) else cause


def _fix(e: BaseException, otherwise: str) -> str:
  return "free space there or choose another --out" if _full(e) else otherwise


def _write_failure(e: BaseException, out_dir: str, started: bool) -> OSError:
  """The one-line OSError for a failed write into out_dir (keeping e's errno)."""
  left = "holds no export (the files written were removed)" if started else "is as it was"
  out = OSError(
    f"writing the export to {out_dir} failed: {_cause(e, out_dir)}; {out_dir} "
    f"{left}: {_fix(e, 'fix that or choose another --out')}, then run rove-export "
    f"again"
  )
  out.errno = getattr(e, "errno", None)
  return out


@dataclasses.dataclass(frozen=True)
class Exported:
  """An export read back: the model's config and parameters and the tokenizer it was trained
  with."""

  config: GPTConfig
  params: Any
  tokenizer: tokenization.Tokenizer
  run: dict  # config.json's "rove_jax_run": step, workdir name, training length, tokenizer

  def model(self):
    return pretrained.build(self.config, self.params)

  def encode(self, text: str) -> np.ndarray:
    return self.tokenizer.encode(text)

  def decode(self, ids) -> str:
    return self.tokenizer.decode(np.asarray(ids))

  def generate(
    self,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    seed: int = 0,
    rope_scaling=None,
  ) -> str:
    """The text after `prompt`: encoded, `max_new_tokens` generated (greedy at temperature
    0), decoded. rope_scaling (a RopeScaling or transformers' dict; None: the model's) extends
    the context past the training length, e.g. YaRN (rove_jax.nn.decoding.generate)."""
    ids = self.encode(prompt)[None]
    rope_scaling = scaling.RopeScaling.coerce(rope_scaling)
    # said here, so that the warning names the caller's line rather than this one
    decoding.warn_past_training_length(self.config, ids.shape[1], max_new_tokens, rope_scaling)
    out = decoding.generate(
      self.model(),
      ids,
      max_new_tokens,
      temperature=temperature,
      top_k=top_k,
      rng=jax.random.key(seed),
      valid_vocab=self.tokenizer.vocab_size,
      rope_scaling=rope_scaling,
    )
    return self.decode(np.asarray(out[0])[ids.shape[1] :])


def load(path: str) -> Exported:
  """An export written by `export_run` (local or gs://), with its tokenizer.

  Raises:
    ValueError: not an export of a rove-jax run (no "rove_jax_run" in its config.json), or a
      tokenizer that is not the one recorded (another fingerprint).
    FileNotFoundError: no weights or config. ImportError: the tokenizer needs a package (the
      `[data]` extra for tokenizer.json, `[tiktoken]` for tiktoken:NAME).
  """
  path = paths.resolve(path, what="export")
  config, params = pretrained.load(path)
  run = json.loads(paths.read_text(paths.join(path, param_files.CONFIG))).get("rove_jax_run")
  if run is None:
    raise ValueError(
      f"{path} is not a rove-export of a training run: its config.json has no "
      f'"rove_jax_run" (the tokenizer is unknown); load the weights with '
      f"rove_jax.nn.pretrained.load and give the tokenizer yourself"
    )
  want = run["tokenizer"]
  if want.get("file"):
    file = paths.inside(path, want["file"], what=f"{path}: rove_jax_run.tokenizer.file")
    tok = tokenization.HFTokenizer.from_json(
      paths.read_text(file), name=want.get("name", want["file"])
    )
  else:
    tok = tokenization.get_tokenizer(want["spec"])
  if want.get("fingerprint") and tok.fingerprint != want["fingerprint"]:
    raise ValueError(
      f"the tokenizer of {path} ({tok.name}) is not the one the model was "
      f"trained with (fingerprint {tok.fingerprint[:19]}, recorded "
      f"{want['fingerprint'][:19]}); export the run again"
    )
  return Exported(config=config, params=params, tokenizer=tok, run=run)
