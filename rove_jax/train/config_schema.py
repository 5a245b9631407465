"""The run config as written: ml_collections ConfigDicts for config files and `--config.a.b=value`
overrides, generated from the typed RunConfig (rove_jax.train.run_config), whose defaults and
field types they carry.

`base_config(preset)` returns every field a run reads, so every field can be overridden and an
unknown key is an error (`override_problem`, the one check, with the closest known name);
configs/*.py start from it. `build` turns one into a RunConfig, once, at the command boundary.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from typing import Any, Optional

import ml_collections
from ml_collections import config_dict

from rove_jax import scaling
from rove_jax.nn.model_config import GPTConfig, padded_vocab_size
from rove_jax.train.run_config import SECTIONS, RunConfig

_PLACEHOLDER_TYPES = {"n_kv_head": int, "d_ff": int, "max_len": int, "rove_layers": tuple}
# model.rope_scaling is a section with one typed field per key of scaling.KEYS, unset ones
# None, so `--config.model.rope_scaling.rope_type=yarn --config.model.rope_scaling.factor=4`
# works from the command line; a config file may also assign a whole dict. Fields not named
# here are floats.
_SCALING_TYPES = {"rope_type": str, "truncate": bool, "original_max_position_embeddings": int,
                  "short_factor": tuple, "long_factor": tuple}


def scaling_fields(rope_scaling) -> ml_collections.ConfigDict:
  """The model.rope_scaling section: every key of scaling.KEYS, set from `rope_scaling` (its
  `to_dict()`, or a dict a config file assigns)."""
  out = ml_collections.ConfigDict()
  for name in scaling.KEYS:
    out[name] = config_dict.placeholder(_SCALING_TYPES.get(name, float))
  for key, value in (rope_scaling or {}).items():
    if key not in out:  # unknown keys reach GPTConfig's validation, which names them
      out[key] = value
    else:
      out[key] = tuple(value) if isinstance(value, list) else value
  return out


def model_fields(cfg: GPTConfig) -> ml_collections.ConfigDict:
  """A ConfigDict of every GPTConfig field (`cfg.to_dict()`), None fields as typed
  placeholders so that `--config.model.n_kv_head=...` style overrides type-check, and
  rope_scaling as a section (`scaling_fields`). n_kv_head, d_ff and max_len are left unset:
  they follow n_head, d_model and data.seq_len (the training length) unless set."""
  out = ml_collections.ConfigDict()
  derived = {"n_kv_head": cfg.n_head, "d_ff": 4 * cfg.d_model, "max_len": cfg.max_len}
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
  """Every field of a RunConfig with its default, the model section GPTConfig's `preset`
  (tiny, gpt2_124m, gpt2_354m); unset fields are typed placeholders."""
  c = ml_collections.ConfigDict()
  model = getattr(GPTConfig, preset)()
  c.model = model_fields(model)
  for f in dataclasses.fields(RunConfig):
    if f.name == "model":
      continue
    if f.name in SECTIONS:
      section = ml_collections.ConfigDict()
      for g in dataclasses.fields(SECTIONS[f.name]):
        section[g.name] = _value(SECTIONS[f.name], g.name, g.default)
      c[f.name] = section
    else:
      c[f.name] = _value(RunConfig, f.name, f.default)
  c.data.seq_len = model.max_len  # the preset's context, which model.max_len then follows
  return c


def _value(cls, name: str, default):
  """A field's default, or for None a placeholder of the field's type (Optional[int] -> int)."""
  if default is not None:
    return default
  hint = typing.get_type_hints(cls)[name]
  kinds = [t for t in typing.get_args(hint) if t is not type(None)]
  return config_dict.placeholder(kinds[0] if kinds else str)


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
              f"rove_jax/train/config_schema.py:base_config; rove-train --help-config lists "
              f"every field)")
    node = node[part]
    path.append(part)
  if isinstance(node, ml_collections.ConfigDict):
    example = {"model.rope_scaling": " (e.g. --config.model.rope_scaling.rope_type=yarn "
                                     "--config.model.rope_scaling.factor=4)"}.get(key, "")
    return (f"--config.{key}{'=' + value if value is not None else ''}: {key} is a section, "
            f"not a field; set its fields one by one, --config.{key}.FIELD=VALUE{example}")
  return None


def unknown_key_problems(fields: dict) -> dict[str, str]:
  """{key: `override_problem`} for every key of a config (as `to_plain` gives it) the schema
  lacks; model.rope_scaling's keys depend on rope_type and are RopeScaling's to check."""
  root = base_config("tiny")

  def walk(fields, schema, prefix):
    out = {}
    for key, value in fields.items():
      path = f"{prefix}{key}"
      if path == "model.rope_scaling":
        continue
      section = isinstance(schema[key], ml_collections.ConfigDict) if key in schema else None
      if section is None or isinstance(value, dict) != section:
        out[path] = (override_problem(path, schema=root) or
                     f"{path} is a section, not a field: set its fields one by one")
      elif section:
        out.update(walk(value, schema[key], path + "."))
    return out

  return walk(fields, root, "")


def to_plain(value: Any) -> Any:
  """JSON-friendly copy of a config (ConfigDict -> dict, tuples -> lists)."""
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  if isinstance(value, dict):
    return {k: to_plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_plain(v) for v in value]
  return value


# ------------------------------------------------------------------- the boundary


def build(c, *, read_data: bool = True, log=None, model_given=None) -> RunConfig:
  """The RunConfig of a config as written: an ml_collections ConfigDict (a config file plus
  overrides), a plain dict of the same shape, or a RunConfig (returned as is).

  Checks every key against the schema (an unknown one is named, with the closest known name),
  fills what the data decides (a prepared dataset's tokenizer and vocabulary size: `_prepared`)
  and what init_from's checkpoint decides (its model and tokenizer: rove_jax.train.init_from,
  where `model_given`, the model field names the user set, is explained) and validates.
  Raises ValueError before any work. read_data=False leaves what the data and init_from
  decide unset (for checking a command line away from its data).
  """
  if isinstance(c, RunConfig):
    if c.init_from is not None and read_data:  # built elsewhere: still the checkpoint's model
      from rove_jax.train import init_from
      init_from.check_model(c.init_from, c.model)
    if c.data.source == "prepared" and c.data.tokenizer is None and read_data:
      c = build(c.to_dict(), log=log)
    return c
  fields = to_plain(c)
  problems = unknown_key_problems(fields)
  if problems:
    raise ValueError(f"unknown config keys {sorted(problems)}: " + "; ".join(problems.values()))
  model = {k: v for k, v in fields.pop("model", {}).items() if v is not None}
  if fields.get("init_from") and read_data:  # the checkpoint's model and tokenizer (its
    # config.json and tokenizer alone; read_data=False checks a command line without them)
    from rove_jax.train import init_from
    scaling_set = {k: v for k, v in (model.get("rope_scaling") or {}).items() if v is not None}
    if scaling_set:
      model["rope_scaling"] = scaling_set
    else:
      model.pop("rope_scaling", None)
    model = init_from.resolve_model(fields["init_from"], model, model_given, log=log)
    model = {k: v for k, v in model.items() if v is not None}
    fields["data"] = dict(fields.get("data", {}))
    init_from.resolve_tokenizer(fields["init_from"], fields["data"], model["vocab_size"])
  seq_len = fields.get("data", {}).get("seq_len")
  if "max_len" not in model and seq_len is not None:
    model["max_len"] = seq_len  # the context the model is set up for: its training length
  rope_scaling = {k: v for k, v in (model.pop("rope_scaling", None) or {}).items()
                  if v is not None}
  if rope_scaling:  # every key unset (or an empty dict): plain RoPE
    model["rope_scaling"] = rope_scaling
  fields = {k: v for k, v in fields.items()}
  for name in SECTIONS:
    if name in fields:
      fields[name] = {k: v for k, v in fields[name].items()}
  data = fields.get("data", {})
  if data.get("source") == "prepared" and data.get("path") and read_data:
    _prepared(data, model, dry_run=bool(fields.get("dry_run")), log=log)
  try:
    model_cfg = GPTConfig.from_dict(model)
  except ValueError as e:
    raise ValueError(f"config.model: {e}") from None
  return RunConfig.from_dict({**fields, "model": model_cfg.to_dict()})


def _prepared(data: dict, model: dict, *, dry_run: bool, log) -> None:
  """A prepared dataset supplies its tokenizer (data.tokenizer unset) and, with it, a
  vocabulary size large enough for its ids (model.vocab_size rounded up to a multiple of 64);
  a tokenizer given that is not the dataset's is an error."""
  from rove_jax.data import prepared  # the data package loads grain
  try:
    manifest = prepared.read_manifest(data["path"])
  except (ValueError, OSError) as e:
    if dry_run:  # a dry run compiles for a slice from a host that need not see the data
      return
    raise ValueError(f"data.path={data['path']}: {e}") from None
  want = manifest["tokenizer"]
  given = data.get("tokenizer")
  if given is None:
    data["tokenizer"] = want["spec"]
  elif given != want["spec"]:
    raise ValueError(f"data.tokenizer={given!r} but the prepared dataset {data['path']} was "
                     f"tokenized with {want['spec']!r}; leave data.tokenizer unset (the dataset "
                     f"supplies it) or prepare the corpus again with {given!r}")
  vocab = int(want["vocab_size"])
  need = padded_vocab_size(vocab)
  have = model.get("vocab_size", GPTConfig.vocab_size)
  if have < vocab:
    if given is not None:
      raise ValueError(f"model.vocab_size={have} is smaller than the {vocab} ids of the "
                       f"prepared dataset's tokenizer {want['spec']!r}; set "
                       f"--config.model.vocab_size={need} or leave data.tokenizer unset")
    model["vocab_size"] = need
    (log or _log)(f"model.vocab_size={need}: the prepared dataset's tokenizer "
                  f"{want['spec']!r} has {vocab} ids")


def _log(message: str) -> None:
  print(f"[rove_jax.train] {message}", file=sys.stderr, flush=True)
