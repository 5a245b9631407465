"""What a training run checks before it touches a workdir's checkpoints: that the workdir is a
writable directory (`check_workdir`), that no other trainer is writing there (the writer lock,
`rove_jax.storage.lock`, taken by process 0), that the saved run is one this config can
continue (`check_resumable`, `check_fresh_start`); and how it then starts (`restore`): from the
newest readable checkpoint, checked against the data it was trained on, else new.

Compatibility: the newest checkpoint whose metadata reads is compared with the new config before
anything is restored or moved: model shape, tokenizer, and the optimizer state's structure
(naming the optimizer settings that changed). An incompatible config is an error that leaves
every file where it is.
"""

from __future__ import annotations

import uuid

from rove_jax.storage import paths
from rove_jax.storage.lock import LockError, WriterLock  # noqa: F401 - the loop's lock
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import init_from

# The fields that fix the parameter shapes: a workdir's checkpoints must agree on them.
SHAPE_FIELDS = (
  "vocab_size",
  "n_layer",
  "n_head",
  "n_kv_head",
  "d_model",
  "d_ff",
  "max_len",
  "pos_encoding",
  "norm",
  "mlp",
  "use_bias",
  "qkv_bias",
  "tie_embeddings",
  "t5_num_buckets",
)


class IncompatibleRun(ValueError):
  """The saved run cannot be continued with this config."""


# --------------------------------------------------------------------------- compatibility


def check_tokenizer(saved_meta: dict, tokenizer, *, workdir: str) -> None:
  """Raises IncompatibleRun when `tokenizer` maps text to other ids than the tokenizer a
  checkpoint was saved with (its fingerprint, recorded at save), or when the checkpoint
  records none. For a tokenizer kept as a file in the workdir (bpe), that file was changed or
  damaged."""
  saved = saved_meta.get("tokenizer", {}).get("fingerprint")
  if saved == tokenizer.fingerprint:
    return
  if saved is None:
    raise IncompatibleRun(
      f"the checkpoint at step {saved_meta.get('step')} in {workdir} records "
      f"no tokenizer fingerprint, so the ids it was trained on are unknown; "
      f"it was not written by rove-train"
    )
  where = getattr(tokenizer, "name", "the tokenizer")
  files = [f for f in paths.listdir(workdir) if f.startswith("tokenizer-")]
  raise IncompatibleRun(
    f"the tokenizer {where} loaded for {workdir} is not the one its checkpoint at step "
    f"{saved_meta.get('step')} was trained with (fingerprint {tokenizer.fingerprint[:19]}, "
    f"saved {saved[:19]}){': its file ' + ', '.join(files) + ' changed' if files else ''}. "
    f"Restore the tokenizer file the run was trained with, or train into a new --workdir; "
    f"nothing was moved or deleted."
  )


def check_data(
  saved_meta: dict, identity: dict, *, allow_changed: bool, workdir: str, log=print
) -> None:
  """Raises IncompatibleRun when the data a run resumes on is not the data its checkpoint was
  trained on (`Data.identity`: the prepared dataset's manifest digest, or the token streams'
  digests), unless `allow_changed`, which logs the change instead."""
  saved = saved_meta.get("data_identity")
  if saved is None or saved == identity:
    return
  from rove_jax.data import pipeline

  change = pipeline.describe_identity_change(saved, identity)
  if allow_changed:
    log(f"WARNING: {change}; continuing on the new data (data.allow_changed=True)")
    return
  raise IncompatibleRun(
    f"the training data changed since the checkpoint at step {saved_meta.get('step')} in "
    f"{workdir}: {change}. Resuming would train on other batches than the run began with. "
    f"Restore the data, train into a new --workdir, or pass --config.data.allow_changed=True "
    f"to continue on the new data; nothing was moved or deleted."
  )


def model_diffs(saved: dict, mine: dict) -> dict:
  """{field: (saved, now)} over the shape-defining model fields."""
  return {k: (saved.get(k), mine.get(k)) for k in SHAPE_FIELDS if saved.get(k) != mine.get(k)}


def _section_diffs(saved: dict, mine: dict, prefix: str) -> list[str]:
  keys = sorted(set(saved) | set(mine))
  return [
    f"{prefix}.{k}: saved {saved.get(k)!r}, now {mine.get(k)!r}"
    for k in keys
    if saved.get(k) != mine.get(k)
  ]


# The settings that decide what a resumed run computes: the model, the data, the optimizer
# and its schedule (steps sets the cosine decay), the seed. The others (logging, checkpoint
# cadence, tracking, run_steps, the mesh, init_from, which a resumed run ignores and the loop
# says so) may change between invocations without a word.
COMPARED = ("model.", "data.", "optim.", "steps", "seed")
# data.allow_changed: check_data reports what it allows. optim.loss_impl: the fused and unfused
# losses compute the same loss (to float32 rounding), so a run may switch between them, and
# between the Hopper fused kernel's variants (model.fused_variant: bf16 turns round once more).
NOT_COMPARED = ("data.allow_changed", "optim.loss_impl", "model.fused_variant")


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict) and v and k != "rope_scaling":  # rope_scaling compares as one value
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def config_changes(saved: dict, meta: dict) -> list[str]:
  """ "field: saved X, now Y" for each COMPARED run setting in which `meta` differs from the
  checkpoint metadata `saved`."""
  before = {**_flat(saved.get("model", {}), "model."), **_flat(saved.get("config", {}))}
  after = {**_flat(meta.get("model", {}), "model."), **_flat(meta.get("config", {}))}
  return [
    f"{k}: saved {before.get(k)!r}, now {after.get(k)!r}"
    for k in sorted(set(before) | set(after))
    if before.get(k) != after.get(k) and k.startswith(COMPARED) and k not in NOT_COMPARED
  ]


def check_resumable(
  ckpt: ckpt_lib.Checkpointer, meta: dict, abstract_flat: dict, *, workdir: str, log=print
) -> None:
  """Raises IncompatibleRun (or LayoutError) when the newest readable checkpoint of `ckpt`
  cannot be continued by a run whose metadata would be `meta` and whose flat train state is
  `abstract_flat`. Nothing is restored, moved or deleted. A config that can continue the run
  but differs from the one it was saved with (a learning rate, the step count that sets the
  schedule) is logged as a warning naming each changed field.
  """
  found = ckpt.newest_meta(report=log)
  if found is None:
    return
  step, saved = found
  _warn_changes(saved, meta, step, workdir, log)
  fix = (
    f"Rerun with the settings the run was started with (its config is in the checkpoint "
    f"metadata and metrics), or train into a new --workdir than {workdir}."
  )
  diffs = model_diffs(saved.get("model", {}), meta["model"])
  if diffs:
    raise IncompatibleRun(
      f"workdir {workdir} holds checkpoints of a different model (field: "
      f"saved, now): {diffs}. {fix}"
    )
  saved_tok = saved.get("tokenizer", {}).get("spec")
  if saved_tok is not None and saved_tok != meta["tokenizer"]["spec"]:
    raise IncompatibleRun(
      f"the checkpoint at step {step} was trained with tokenizer "
      f"{saved_tok!r}, the config now says {meta['tokenizer']['spec']!r} "
      f"(data.tokenizer). {fix}"
    )
  stored = ckpt.stored_entries(step)
  if stored is None:
    return  # unreadable: the restore reports it and falls back
  want = set(abstract_flat)
  differ = set(stored) ^ want
  if differ and not any(n.startswith(ckpt_lib.PARAMS) for n in differ):
    changed = _section_diffs(
      saved.get("config", {}).get("optim", {}), meta["config"].get("optim", {}), "optim"
    )
    raise IncompatibleRun(
      f"the optimizer state saved at step {step} has another structure than this config's "
      f"({len(want - set(stored))} entries missing, {len(set(stored) - want)} unexpected); "
      f"changed optimizer settings: {'; '.join(changed) or 'none found in the config'}. {fix}"
    )
  ckpt.check_layout(step, want)  # parameters named differently: LayoutError


def check_fresh_start(ckpt: ckpt_lib.Checkpointer, fresh_start: bool) -> None:
  """Raises ValueError when every checkpoint of the run was found unreadable (moved to the
  quarantine) and `fresh_start` (config.fresh_start) was not given: starting again from step 0
  would overwrite its metrics."""
  if ckpt.latest_step() is None and ckpt.quarantined() and not fresh_start:
    raise ValueError(
      f"{ckpt.directory} holds no checkpoint, but {len(ckpt.quarantined())} earlier ones of "
      f"this run were found unreadable and moved to {ckpt.quarantine_dir()}. Starting again "
      f"from step 0 would overwrite its metrics: move a checkpoint back if you can repair it, "
      f"or pass --config.fresh_start=True to start from step 0 (the moved ones stay)."
    )


def restore(c, ckpt: ckpt_lib.Checkpointer, program, data, iterator, state, *, workdir, log):
  """(state, start step, restored?) of run config `c`: the newest readable checkpoint's state
  (onto `program`'s mesh, a program.Program), with the data `iterator` set to its position;
  else, for a new run, init_from's parameters or `state`.

  Raises:
    IncompatibleRun: the workdir's tokenizer or data changed since the save.
  """
  target = program.restore_target  # onto this run's mesh, in the checkpoints' layout
  restored = ckpt.restore_latest(ckpt_lib.to_flat(target), report=log)
  if restored is not None:
    start, flat, data_state, saved_meta = restored
    # A tokenizer file in the workdir that changed since the save would feed the run other ids.
    check_tokenizer(saved_meta, data.tokenizer, workdir=workdir)
    # So would a dataset re-prepared, or files edited, since the run began.
    check_data(
      saved_meta, data.identity, allow_changed=c.data.allow_changed, workdir=workdir, log=log
    )
    state = program.from_layers(ckpt_lib.from_flat(flat, target))
    iterator.set_state(data_state)
    log(
      f"resumed from step {start} in {ckpt.directory}"
      + (f"; init_from={c.init_from} is ignored" if c.init_from else "")
    )
    return state, start, True
  if c.init_from is not None:  # a new run from a pretrained model (train/init_from.py)
    params = init_from.load_params(c, program.saved_shardings.params, log=log)
    state = state.replace(params=program.stack_params(params))
  return state, 0, False


def _warn_changes(saved: dict, meta: dict, step: int, workdir: str, log) -> None:
  changes = config_changes(saved, meta)
  if not (changes and "config" in saved):
    return
  what = (
    "the run is finished, so nothing is trained"
    if step >= meta["config"].get("steps", 0)
    else "the run continues under the new values. Rerun with the saved ones, or train into "
    "a new --workdir, to keep the run as it began"
  )
  log(
    f"WARNING: this config differs from the one the run in {workdir} was saved with at step "
    f"{step} ({'; '.join(changes)}); {what}."
  )


def check_workdir(workdir: str) -> str:
  """The workdir resolved (an absolute local path or gs://bucket/path), created if needed and
  proved writable, before any work starts.

  Raises:
    ValueError: a file, not a directory; not writable (access refused); a name orbax cannot
      write under.
    OSError: the storage failed while the workdir was checked (unreachable, full, erroring).
    rove_jax.storage.paths.MissingExtra: gs:// without gcsfs.
  """
  workdir = paths.resolve(workdir, what="--workdir")
  paths.check_orbax_path(workdir)
  if paths.isfile(workdir):
    raise ValueError(
      f"--workdir {workdir} is a file, not a directory: a run keeps its "
      f"checkpoints, metrics and data cache in a directory; choose another path"
    )
  try:
    paths.makedirs(workdir)
    probe = paths.join(workdir, f".write_test_{uuid.uuid4().hex[:12]}")
    paths.write_atomic(probe, b"ok")
    paths.remove(probe)
  except Exception as e:  # noqa: BLE001 - an OSError, or a GCS client library's own error
    if not (isinstance(e, OSError) or paths.is_storage_error(e)):
      raise
    # Storage that failed (unreachable, full, erroring) is I/O, exit 1; anything else (a
    # refusal, a missing bucket, a file in the way) is this workdir's fault.
    if paths.is_unavailable(e):
      raise OSError(
        f"checking that workdir {workdir} is writable failed "
        f"({paths.describe_failure(e, workdir)}); nothing was trained: rerun when "
        f"the storage works again, or choose another --workdir"
      ) from None
    raise ValueError(
      f"workdir {workdir} is not writable ({paths.describe_failure(e, workdir)})"
      f"; choose another --workdir"
    ) from None
  return workdir
