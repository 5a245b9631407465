"""Run configs (ml_collections) for train.py: the schema, defaults and validation.

`base_config(preset)` returns every field a run reads, so `--config.a.b=value` overrides work
for all of them and an unknown key is an error. configs/*.py start from it.

The model section is `GPTConfig.to_dict()` and `to_model_config`, the one place a run config
becomes a GPTConfig, is `GPTConfig.from_dict()`: the same conversion that writes and reads
checkpoint metadata, which holds the model config once, resolved, beside the rest of the run
config (`metadata_config`). Nothing here touches a JAX device (validation is numpy only), so a
config can be built before jax.distributed starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import uuid
from typing import Any, Optional

import ml_collections
from ml_collections import config_dict

from rove_jax import scaling
from rove_jax.nn.model_config import GPTConfig
from rove_jax.storage import paths
from rove_jax.train import tracking

_PLACEHOLDER_TYPES = {"n_kv_head": int, "d_ff": int, "rove_layers": tuple}
# model.rope_scaling is a section with one typed field per scaling.RopeScaling field, unset ones
# None, so `--config.model.rope_scaling.rope_type=yarn --config.model.rope_scaling.factor=4`
# works from the command line; a config file may also assign a whole dict. Fields not named
# here are floats.
_SCALING_TYPES = {"rope_type": str, "truncate": bool, "original_max_position_embeddings": int,
                  "short_factor": tuple, "long_factor": tuple}


def scaling_fields(rope_scaling) -> ml_collections.ConfigDict:
  """The model.rope_scaling section: every RopeScaling field, set from `rope_scaling` (its
  `to_dict()`, or a dict a config file assigns)."""
  out = ml_collections.ConfigDict()
  for field in dataclasses.fields(scaling.RopeScaling):
    out[field.name] = config_dict.placeholder(_SCALING_TYPES.get(field.name, float))
  for key, value in (rope_scaling or {}).items():
    if key not in out:  # unknown keys reach GPTConfig's validation, which names them
      out[key] = value
    else:
      out[key] = tuple(value) if isinstance(value, list) else value
  return out


def model_fields(cfg: GPTConfig) -> ml_collections.ConfigDict:
  """A ConfigDict of every GPTConfig field (`cfg.to_dict()`), None fields as typed
  placeholders so that `--config.model.n_kv_head=...` style overrides type-check, and
  rope_scaling as a section (`scaling_fields`)."""
  out = ml_collections.ConfigDict()
  derived = {"n_kv_head": cfg.n_head, "d_ff": 4 * cfg.d_model}  # left None: follow overrides
  for name, value in cfg.to_dict().items():
    if derived.get(name) == value:
      value = None
    if name == "rope_scaling":
      value = scaling_fields(value)
    elif value is None:
      value = config_dict.placeholder(_PLACEHOLDER_TYPES.get(name, str))
    elif name == "rove_layers":
      value = tuple(value)  # the placeholder's type, so overrides of a set value check too
    out[name] = value
  return out


def base_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = model_fields(getattr(GPTConfig, preset)())

  c.data = ml_collections.ConfigDict()
  # stdlib | text | parquet | hf | recall (synthetic, data.recall) | prepared (rove-prepare's
  # directory, data.prepared)
  c.data.source = "stdlib"
  c.data.path = config_dict.placeholder(str)
  c.data.val_path = config_dict.placeholder(str)
  c.data.text_field = "text"
  c.data.val_fraction = 0.02
  c.data.max_files = config_dict.placeholder(int)
  c.data.max_train_tokens = config_dict.placeholder(int)
  c.data.max_val_tokens = config_dict.placeholder(int)
  c.data.hf_config = config_dict.placeholder(str)
  c.data.tokenizer = "bytes"  # bytes | bpe | bpe:VOCAB | path/to/tokenizer.json | tiktoken:gpt2
  c.data.seq_len = c.model.max_len
  c.data.batch_size = 16  # global
  c.data.packing = False
  # A resume on data other than the checkpoint's (a re-prepared dataset, edited files) is an
  # error unless this is True; the new data's identity is then recorded from that step on.
  c.data.allow_changed = False

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 1e-3
  c.optim.min_lr_ratio = 0.1
  c.optim.warmup_steps = 100
  c.optim.weight_decay = 0.1
  c.optim.b1 = 0.9
  c.optim.b2 = 0.95
  c.optim.eps = 1e-8
  c.optim.clip_norm = 1.0
  c.optim.grad_accum = 1
  c.optim.max_nonfinite = 10  # consecutive skipped updates before the run stops

  c.mesh = ml_collections.ConfigDict()  # -1: the devices left over by the other axes
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1

  c.steps = 1000
  c.run_steps = config_dict.placeholder(int)  # stop this invocation after this many steps
  c.log_every = 10
  c.eval_every = 200
  c.eval_batches = 16
  c.checkpoint_every = 200
  c.keep_checkpoints = 3
  c.async_checkpoints = True
  c.fresh_start = False  # start from step 0 although earlier checkpoints were found unreadable
  c.seed = 0
  c.progress = True
  # Metrics sinks beside metrics.jsonl: "tensorboard", "wandb" (Weights & Biases), both
  # comma-separated, or "none" (rove_jax.train.tracking); the W&B run's settings.
  c.tracking = "tensorboard"
  c.wandb = ml_collections.ConfigDict()
  c.wandb.project = "rove-jax"
  c.wandb.entity = config_dict.placeholder(str)
  c.wandb.name = config_dict.placeholder(str)  # default: the workdir's name
  c.wandb.group = config_dict.placeholder(str)
  c.wandb.mode = "online"  # "offline": written under workdir/wandb for `wandb sync`
  # "START:END": a jax.profiler trace of training steps START..END into workdir/profile.
  c.profile_steps = config_dict.placeholder(str)
  c.sample_tokens = 200  # a generated sample printed at the end (0: none)
  # Pre-flight: compile the train step for the mesh and print memory, FLOPs and collectives
  # (rove_jax.aot.compile), then exit without training; on this machine's devices, or, ahead of time
  # from any host, on a named slice ("v5e-256", "v4-32", "h100-8"; needs libtpu or JAX's CUDA
  # plugin).
  c.dry_run = False
  c.dry_run_topology = config_dict.placeholder(str)
  return c


def paper_config(preset: str, *, lr: float) -> ml_collections.ConfigDict:
  """A GPT-2 run for a preset set up like the paper's, as far as the paper says.

  From the paper (2606.11275, the experiments section): GPT-2-style models of ~124M and ~354M
  parameters, trained on FineWebEdu-10B with a context of 1024 tokens. Everything else here is
  an ASSUMPTION, nanoGPT-style defaults the paper does not give: the GPT-2 tokenizer, 0.5M-token
  batches (512 x 1024), 19,073 steps (one pass over ~10B tokens), the learning rate `lr`, 700
  warmup steps, weight decay 0.1, AdamW's betas, bf16 compute with float32 master weights.
  """
  c = base_config(preset)
  c.model.pos_encoding = "rove"
  c.model.dtype = "bfloat16"
  c.data.source = "parquet"
  c.data.path = "fineweb-edu/*.parquet"
  c.data.tokenizer = "tiktoken:gpt2"
  c.data.seq_len = 1024
  c.data.batch_size = 512  # assumed: 512 x 1024 = 0.5M tokens a step
  c.optim.lr = lr  # assumed (the paper gives no optimizer settings)
  c.optim.warmup_steps = 700  # assumed
  c.optim.weight_decay = 0.1  # assumed
  c.steps = 19073  # assumed: one pass over ~10B tokens
  c.log_every = 10
  c.eval_every = 500
  c.eval_batches = 40
  c.checkpoint_every = 1000
  c.keep_checkpoints = 3
  c.sample_tokens = 0
  return c


def to_model_config(c: ml_collections.ConfigDict) -> GPTConfig:
  """The GPTConfig of a run config's model section (None fields take GPTConfig's defaults;
  an empty rope_scaling dict means plain RoPE)."""
  fields = {k: v for k, v in c.model.to_dict().items() if v is not None}
  rope_scaling = {k: v for k, v in (fields.pop("rope_scaling", None) or {}).items()
                  if v is not None}
  if rope_scaling:  # all keys unset (or an empty dict): plain RoPE
    fields["rope_scaling"] = rope_scaling
  try:
    return GPTConfig.from_dict(fields)
  except ValueError as e:
    raise ValueError(f"config.model: {e}") from None


_DECAY_HINT = " (Adam's moment decay: 1 never forgets, the updates turn NaN)"


def validate(c: ml_collections.ConfigDict) -> GPTConfig:
  """Checks the run config against the schema and its values; returns the model config.

  Raises ValueError naming the field before anything expensive runs.
  """
  schema = base_config("tiny")
  unknown = _unknown_keys(c, schema)
  if unknown:
    raise ValueError(f"unknown config keys {unknown}; see rove_jax/train/run_config.py:"
                     f"base_config for the fields a run reads")
  model = to_model_config(c)
  d = c.data
  if d.seq_len is None or d.seq_len < 1:
    raise ValueError(f"data.seq_len must be a positive int, got {d.seq_len}")
  if d.seq_len > model.max_len:
    raise ValueError(f"data.seq_len={d.seq_len} exceeds model.max_len={model.max_len}, the "
                     f"training context the positional encoding is set up for; set "
                     f"--config.model.max_len={d.seq_len}")
  if d.source == "recall":
    # numpy only, but rove_jax.data's package loads grain: only recall configs pay for it
    from rove_jax.data import recall
    spec = recall.RecallSpec.parse(d.path)
    if spec.seq_len != d.seq_len:
      raise ValueError(f"data.path={d.path!r}: the recall documents are made for seq_len="
                       f"{spec.seq_len} but data.seq_len={d.seq_len}; set seq_len={d.seq_len} "
                       f"in data.path (each document must fill one training window)")
    if d.packing:
      raise ValueError("data.packing: a recall window is [eot] + one document, the layout its "
                       "test samples use; train the recall source with packing=False")
  # Whether the directory holds a manifest is checked when the data is opened, the run's first
  # step: a dry run compiles for a slice from a host that need not see the data.
  if d.source == "prepared" and not d.path:
    raise ValueError("data.source=prepared needs data.path: the directory rove-prepare wrote; "
                     "run rove-prepare --out DIR first and set --config.data.path=DIR")
  for name in ("steps", "log_every", "eval_every", "checkpoint_every", "eval_batches",
               "keep_checkpoints", "optim.grad_accum", "optim.max_nonfinite"):
    value = _get(c, name)
    if not (_is_int(value) and value >= 1):
      raise ValueError(f"{name} must be an int >= 1, got {value!r}")
  if c.run_steps is not None and not (_is_int(c.run_steps) and c.run_steps >= 1):
    raise ValueError(f"run_steps must be an int >= 1 (the steps this invocation runs before it "
                     f"saves and exits) or unset, got {c.run_steps!r}")
  if not (_is_int(c.sample_tokens) and c.sample_tokens >= 0):
    raise ValueError(f"sample_tokens must be an int >= 0 (0: no sample), got "
                     f"{c.sample_tokens!r}")
  o = c.optim
  # name: (low, high, low included, high included)
  ranges = {"lr": (0, math.inf, False, False), "weight_decay": (0, math.inf, True, False),
            "min_lr_ratio": (0, 1, True, True), "b1": (0, 1, True, False),
            "b2": (0, 1, True, False), "eps": (0, math.inf, False, False),
            "clip_norm": (0, math.inf, True, False)}
  for name, (lo, hi, lo_ok, hi_ok) in ranges.items():
    value = o[name]
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (lo <= value if lo_ok else lo < value) and (value <= hi if hi_ok else value < hi))
    if not ok:
      interval = f"{'[' if lo_ok else '('}{lo}, {hi}{']' if hi_ok else ')'}"
      hint = {"clip_norm": " (clip_norm=0 turns clipping off)",
              "b1": _DECAY_HINT, "b2": _DECAY_HINT}.get(name, "")
      raise ValueError(f"optim.{name} must be a finite number in {interval}, got {value!r}{hint}")
  if not 0 <= o.warmup_steps <= c.steps:
    raise ValueError(f"optim.warmup_steps={o.warmup_steps} must be in [0, steps={c.steps}]")
  sinks = tracking.parse_tracking(c.tracking)
  if "wandb" in sinks:
    if c.wandb.mode not in tracking.WANDB_MODES:
      raise ValueError(f"wandb.mode must be one of {tracking.WANDB_MODES}, got "
                       f"{c.wandb.mode!r}")
    if importlib.util.find_spec("wandb") is None:
      raise ValueError("tracking=wandb needs the wandb package: pip install 'rove-jax[wandb]' "
                       "(or pip install wandb), or leave wandb out of --config.tracking")
  tracking.parse_profile_steps(c.profile_steps, c.steps)
  for name in ("data", "fsdp", "tensor"):
    value = c.mesh[name]
    if not (isinstance(value, int) and (value >= 1 or value == -1)):
      raise ValueError(f"mesh.{name} must be a positive int or -1, got {value!r}")
  return model


def override_problem(key: str, value: Optional[str] = None, *,
                     schema: Optional[ml_collections.ConfigDict] = None) -> Optional[str]:
  """Why a command-line override `--config.KEY=VALUE` cannot set a field, or None.

  Checks KEY against the schema (`base_config`, built once by the caller that checks several
  keys): an unknown name gets the closest valid one at its level, a section (e.g.
  model.rope_scaling) is refused with how to set its fields. The value's type is absl's to
  check.
  """
  node, path, parts = schema or base_config("tiny"), [], key.split(".")
  for i, part in enumerate(parts):
    here = ".".join(path) or "the config"
    if not isinstance(node, ml_collections.ConfigDict):
      return (f"--config.{key}: {here} is a field, not a section: it has no {part!r}; set "
              f"--config.{here}=VALUE")
    if part not in node:
      close = difflib.get_close_matches(part, list(node.keys()), n=1, cutoff=0.5)
      fields = ", ".join(sorted(node.keys()))
      hint = (f"did you mean --config.{'.'.join(path + close + parts[i + 1:])}?" if close
              else f"{here} has: {fields}")
      return (f"--config.{key}: {here} has no field {part!r}; {hint} (the schema is "
              f"rove_jax/train/run_config.py:base_config)")
    node = node[part]
    path.append(part)
  if isinstance(node, ml_collections.ConfigDict):
    example = {"model.rope_scaling": " (e.g. --config.model.rope_scaling.rope_type=yarn "
                                     "--config.model.rope_scaling.factor=4)"}.get(key, "")
    return (f"--config.{key}{'=' + value if value is not None else ''}: {key} is a section, "
            f"not a field; set its fields one by one, --config.{key}.FIELD=VALUE{example}")
  return None


def _get(c, dotted: str):
  for part in dotted.split("."):
    c = c[part]
  return c


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _unknown_keys(c, schema, prefix="") -> list[str]:
  out = []
  for key in c.keys():
    path = f"{prefix}{key}"
    if key not in schema:
      out.append(path)
    elif path == "model.rope_scaling":
      continue  # its keys depend on rope_type: the scaling validation names unknown ones
    elif isinstance(c[key], ml_collections.ConfigDict):
      if isinstance(schema[key], ml_collections.ConfigDict):
        out += _unknown_keys(c[key], schema[key], path + ".")
  return out


def check_workdir(workdir: str) -> str:
  """The workdir resolved (an absolute local path or gs://bucket/path), created if needed and
  proved writable, before any work starts.

  Raises:
    ValueError: a file, not a directory; not writable; a name orbax cannot write under.
    rove_jax.storage.paths.MissingExtra: gs:// without gcsfs.
  """
  workdir = paths.resolve(workdir, what="--workdir")
  paths.check_orbax_path(workdir)
  if paths.isfile(workdir):
    raise ValueError(f"--workdir {workdir} is a file, not a directory: a run keeps its "
                     f"checkpoints, metrics and data cache in a directory; choose another path")
  try:
    paths.makedirs(workdir)
    probe = paths.join(workdir, f".write_test_{uuid.uuid4().hex[:12]}")
    paths.write_atomic(probe, b"ok")
    paths.remove(probe)
  except Exception as e:  # noqa: BLE001 - an OSError, or a GCS client library's own error
    if not (isinstance(e, OSError) or paths.is_storage_error(e)):
      raise
    raise ValueError(f"workdir {workdir} is not writable ({paths.describe_failure(e, workdir)})"
                     f"; choose another --workdir") from None
  return workdir


def run_metadata(c: ml_collections.ConfigDict, model_cfg: GPTConfig) -> dict:
  """A run's checkpoint metadata before its tokenizer is built (the loop adds the tokenizer's
  name, vocabulary size, end-of-text id and fingerprint): the model config once, under
  "model", and the rest of the run config under "config"."""
  return {"model": model_cfg.to_dict(), "config": metadata_config(c),
          "tokenizer": {"spec": c.data.tokenizer}}


def metadata_config(c: ml_collections.ConfigDict) -> dict:
  """The run config as checkpoint metadata stores it: `as_plain(c)` less the model section.
  The metadata holds the model config once, resolved: `GPTConfig.to_dict()` under "model",
  read back with `GPTConfig.from_dict`."""
  out = as_plain(c)
  out.pop("model", None)
  return out


def as_plain(value: Any) -> Any:
  """JSON-friendly copy of a config (ConfigDict -> dict, tuples -> lists)."""
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  if isinstance(value, dict):
    return {k: as_plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [as_plain(v) for v in value]
  return value
