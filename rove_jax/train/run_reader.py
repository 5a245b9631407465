"""Reading a finished run for evaluation and export: the newest readable checkpoint of a
training workdir, restored onto one device, read-only (nothing is moved or deleted).

`load_for_inference(workdir)` is what rove-eval (evaluation.scoring.load_run) and rove-export
(train.export) restore: the parameters, the model config and the metadata read back from the
checkpoint, and the tokenizer the run was trained with, checked against its fingerprint.
`read_run` is the layer below it, for any abstract parameter tree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import orbax.checkpoint as ocp

from rove_jax.data import tokenization
from rove_jax.nn.model import abstract_params
from rove_jax.nn.model_config import GPTConfig
from rove_jax.storage import paths
from rove_jax.train import resume
from rove_jax.train.checkpoint import (
  CHECKPOINTS,
  PARAMS,
  Checkpointer,
  LayoutError,
  check_layout,
  check_step,
  checkpoint_dir,
  describe,
  from_flat,
  to_flat,
  verify,
)


def read_run(workdir: str, abstract_params: Callable[[dict], Any], *, report=print):
  """Restores the parameters of the newest readable checkpoint of a training workdir onto one
  device, for evaluation. Nothing is moved or deleted (a training run may be writing there);
  an unreadable checkpoint is reported and the previous one is read instead.

  Args:
    workdir: a training run's directory (checkpoints/ inside).
    abstract_params: meta -> the parameter tree to fill (leaves with .shape and .dtype, e.g.
      `rove_jax.nn.model.abstract_params` of the model config in meta["model"]).
    report: where the fallback messages go.

  Returns:
    (step, params: the tree of abstract_params with arrays, meta: the checkpoint's metadata).

  Raises:
    ValueError: no workdir, no checkpoints, or none readable.
    LayoutError: the checkpoint's parameters are named differently from the model's.
  """
  workdir = paths.resolve(workdir, what="workdir")
  paths.check_orbax_path(workdir, what="workdir")  # orbax would read other arrays than named
  ckdir = checkpoint_dir(workdir)
  if not paths.isdir(workdir):
    raise ValueError(f"workdir {workdir} does not exist; give the --workdir of a training run")
  if not paths.isdir(ckdir):
    raise ValueError(
      f"{workdir} holds no {CHECKPOINTS}/ directory: train it first "
      f"(rove-train --config ... --workdir {workdir})"
    )
  ck = Checkpointer(ckdir, read_only=True)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def restore_step(step):
    stored = ck.stored_entries(step)
    # Every entry onto one device, whatever mesh wrote it (orbax restores a whole item).
    target = (
      None
      if stored is None
      else {
        name: jax.ShapeDtypeStruct(md.shape, md.dtype, sharding=device)
        for name, md in stored.items()
      }
    )
    restored = ck.manager.restore(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()),
    )
    meta, state = dict(restored["meta"]), restored["state"]
    verify(state, meta)
    check_step(step, meta, state)
    try:
      abstract = abstract_params(meta)
    except ValueError as e:  # readable, but not a model this code builds: no fallback
      raise LayoutError(
        f"checkpoint at step {step} in {ckdir} describes a model this version cannot build: {e}"
      ) from e
    want = {PARAMS + name for name in to_flat(abstract)}
    check_layout(
      {n for n in state if n.startswith(PARAMS)},
      want,
      where=f"checkpoint at step {step} in {ckdir}",
    )
    return from_flat({name[len(PARAMS) :]: state[name] for name in want}, abstract), meta

  def unreadable(step, e):
    report(
      f"checkpoint at step {step} of {workdir} cannot be restored ({describe(e)}); "
      f"trying the previous one"
    )

  try:
    found = ck.newest_readable(restore_step, on_unreadable=unreadable)
  except RuntimeError as e:
    raise ValueError(str(e)) from e.__cause__
  finally:
    ck.close()
  if found is None:
    raise ValueError(f"{ckdir} holds no finished checkpoint")
  step, (params, meta) = found
  return step, params, meta


def restore_params(workdir: str, abstract_params: Any, *, report=print):
  """(step, params) of the newest readable checkpoint in workdir: `read_run` for a model whose
  abstract parameter tree is already known."""
  step, params, _ = read_run(workdir, lambda meta: abstract_params, report=report)
  return step, params


@dataclasses.dataclass(frozen=True)
class Restored:
  """A finished run restored for inference (`load_for_inference`)."""

  workdir: str  # resolved: absolute, or gs://bucket/path
  step: int
  params: Any  # the GPT's nnx.State of parameters, on one device
  model_config: GPTConfig  # read back from the checkpoint's metadata
  tokenizer: tokenization.Tokenizer  # the one the run was trained with (fingerprint checked)
  meta: dict  # the checkpoint's metadata: "model", "config" (the rest of the run config), ...

  @property
  def train_len(self) -> Optional[int]:
    """The length the run was trained on (data.seq_len), None where the metadata has none."""
    seq_len = self.meta.get("config", {}).get("data", {}).get("seq_len")
    return None if seq_len is None else int(seq_len)


def load_for_inference(workdir: str, *, report=print) -> Restored:
  """The newest readable checkpoint of a training workdir with its model config and tokenizer:
  `read_run` into the parameter tree of the model its metadata describes, then the tokenizer of
  the metadata's spec, checked to map text to the ids the model was trained on.

  Raises:
    ValueError: the workdir or its checkpoints are missing or unreadable, (a LayoutError) they
      were written by another parameter layout, or (resume.IncompatibleRun) the tokenizer found
      is not the one the run was trained with.
    paths.MissingExtra (an ImportError): a gs:// workdir without gcsfs.
  """
  workdir = paths.resolve(workdir, what="workdir")  # absolute, or gs://bucket/path
  step, params, meta = read_run(
    workdir, lambda meta: abstract_params(GPTConfig.from_dict(meta["model"])), report=report
  )
  tokenizer = tokenization.get_tokenizer(meta["tokenizer"]["spec"], workdir=workdir)
  resume.check_tokenizer(meta, tokenizer, workdir=workdir)  # the ids the model was trained on
  return Restored(
    workdir=workdir,
    step=int(step),
    params=params,
    model_config=GPTConfig.from_dict(meta["model"]),
    tokenizer=tokenizer,
    meta=meta,
  )
