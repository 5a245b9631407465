"""Starting a training run from a pretrained model: `--config.init_from=PATH`.

PATH is a transformers checkpoint directory (model_type gpt2, llama, qwen2 or mistral) or a
rove-jax export (rove-export, `rove_jax.nn.pretrained.save`), local or gs://. A new run (no
checkpoint in its workdir yet) starts from its parameters instead of a random init, with a fresh
optimizer state; a resumed run restores its own checkpoint as always and ignores init_from.

rove_jax.train.resolve, before any work, reads the checkpoint's config.json once and finds its
tokenizer (rove_jax.nn.pretrained.inspect); `configure` makes the run's model section the
checkpoint's and checks its tokenizer; `load_params` (called for a new run) reads the tensors.

The model is the checkpoint's. A run may set only what does not change which tensors there are
or what they compute before the attention (FREE below, and pos_encoding):

  pos_encoding    rope <-> rove, for a checkpoint of either (RoVE rotates the values and the
                  output by the same frequencies and adds no parameters); rove_layers with rove
  rope_scaling    e.g. YaRN to fine-tune for a longer context
  max_len         the training context (data.seq_len follows it); not for learned positions,
                  whose table has max_len rows
  dtype, param_dtype, attention_impl, attention_chunk, fused_variant, remat, init_std
                  compute and memory settings (the tensors are cast to param_dtype; init_std
                  is unused: nothing is initialised randomly)

Every other field (the shapes: vocab_size, n_layer, n_head, n_kv_head, d_model, d_ff, the
biases, tied embeddings; and what the tensors mean: norm, norm_eps, mlp, rope_base,
rotary_fraction, rope_layout, sliding_window, the T5 buckets) is the checkpoint's: a value set
that disagrees is an error naming the field. Which model fields count as set: `model_given`
(rove-train passes its --config.model.* flags, so a config file's model section, written for a
model trained from scratch, is replaced, not compared); without it, every model field the
config holds (from Python, pass model_given to rove_jax.train.resolve.resolve).

The tokenizer is the checkpoint's when data.tokenizer is unset: its tokenizer.json (a
transformers directory's, or the file rove-export writes beside the weights), or for an export
of a byte or tiktoken run the spec it records. A data.tokenizer given that is not the same
tokenizer (by fingerprint) is an error; a checkpoint with no tokenizer needs one given.
"""

from __future__ import annotations

import sys
from typing import Iterable, Optional

from rove_jax import scaling
from rove_jax.nn.model_config import DTYPES, ROTARY_ENCODINGS, GPTConfig
from rove_jax.nn.pretrained import TOKENIZER_FILE, Inspected
from rove_jax.storage import errors as storage_errors

FREE = (
  "rope_scaling",
  "max_len",
  "dtype",
  "param_dtype",
  "attention_impl",
  "attention_chunk",
  "fused_variant",
  "remat",
  "init_std",
  "rove_layers",
)


def configure(
  pretrained: Inspected,
  config: GPTConfig,
  tokenizer: Optional[str],
  given: Optional[Iterable[str]],
  *,
  log=None,
) -> tuple[GPTConfig, str]:
  """(model, tokenizer spec) of a run from `pretrained`.

  The tokenizer is its own when `tokenizer` (data.tokenizer) is unset, else `tokenizer`
  checked against it; its ids must fit the checkpoint's vocabulary. The model is its
  architecture, with the fields of `config` named in `given` (the model field names the user
  set; None: every field `config` holds a value for) where FREE allows them.

  Raises:
    ValueError: no tokenizer found or given, a given one that is not the checkpoint's, more
      ids than its vocabulary, or a set field that disagrees with the checkpoint (one line,
      naming the file or the field), before any tensor or data is read.
  """
  path, ckpt = pretrained.path, pretrained.model
  # vocab_size is not FREE: the run's vocabulary is the checkpoint's
  tokenizer = _run_tokenizer(pretrained, tokenizer, ckpt.vocab_size)
  out = ckpt.to_dict()
  model = {k: v for k, v in config.to_dict().items() if v is not None}
  hint = (
    ""
    if given is not None
    else (
      "; from Python, rove_jax.train.resolve.resolve(c, model_given=[...]) names the model "
      "fields you set"
    )
  )
  given = set(model) if given is None else {g for g in given if g in model}
  for name in sorted(given):
    value, have = model[name], out[name]
    if name == "rope_scaling" and value:
      value = scaling.RopeScaling.from_dict(value).to_dict()  # the form `out` holds
    if value == have:
      continue
    switch = name == "pos_encoding" and have in ROTARY_ENCODINGS and value in ROTARY_ENCODINGS
    free = name in FREE and not (name == "max_len" and ckpt.pos_encoding == "learned")
    if not (switch or free):
      raise ValueError(
        f"model.{name}={value!r} disagrees with init_from={path}, whose {name} is {have!r}: "
        f"the model is the checkpoint's; leave model.{name} unset (a run may change "
        f"pos_encoding between rope and rove and {', '.join(FREE)}){hint}"
      )
    out[name] = model[name]
  if out["pos_encoding"] != "rove" and "rove_layers" not in given:
    out["rove_layers"] = None  # an export of a partly-RoVE run, switched to rope
  if out["attention_impl"] != "fused" and "fused_variant" not in given:
    out["fused_variant"] = "default"  # the checkpoint's fused kernel's variant, of no other
  (log or _log)(
    f"init_from={path}: {ckpt.n_layer} layers x {ckpt.d_model}, {ckpt.n_head} "
    f"heads ({ckpt.n_kv_head} kv), vocabulary {ckpt.vocab_size}; pos_encoding "
    f"{ckpt.pos_encoding} -> {out['pos_encoding']}"
  )
  try:
    return GPTConfig.from_dict(out), tokenizer
  except ValueError as e:
    raise ValueError(f"config.model: {e}") from None


def _run_tokenizer(pretrained: Inspected, given: Optional[str], vocab_size: int) -> str:
  """The checkpoint's tokenizer when `given` is unset, else `given` checked against it."""
  from rove_jax.data import tokenization  # the data layer: loaded by training runs only

  path, want = pretrained.path, pretrained.tokenizer
  if want is None and given is None:
    raise ValueError(
      f"init_from={path} holds no {TOKENIZER_FILE} and records no tokenizer; "
      f"set --config.data.tokenizer to the model's tokenizer.json"
    )
  if given is not None and want is not None and given != want:
    trainable = any(s == "bpe" or s.startswith("bpe:") for s in (given, want))
    same = not trainable and (
      tokenization.get_tokenizer(given).fingerprint == tokenization.get_tokenizer(want).fingerprint
    )
    if not same:
      raise ValueError(
        f"data.tokenizer={given!r} is not the tokenizer of init_from={path} "
        f"({want!r}); leave data.tokenizer unset (the checkpoint supplies it)"
      )
  spec = given if given is not None else want
  if not (spec == "bpe" or spec.startswith("bpe:")):
    n = tokenization.get_tokenizer(spec).vocab_size
    if n > vocab_size:
      raise ValueError(
        f"tokenizer {spec!r} has {n} ids but init_from={path} has a vocabulary "
        f"of {vocab_size}; give the model's own tokenizer"
      )
  return spec


def load_params(c, shardings, *, log=print):
  """The parameters of c.init_from for c.model (cast to its param_dtype), placed with
  `shardings` (the train state's parameter shardings).

  Raises:
    ValueError: tensors that are not the model's (names, shapes), naming them.
  """
  import jax
  import numpy as np

  from rove_jax.nn import param_files, pretrained

  try:
    _, params = pretrained.load(c.init_from)
  except (OSError, ValueError) as e:
    raise storage_errors.input_error(e, f"init_from={c.init_from}: {e}") from None
  dtype = DTYPES[c.model.param_dtype]
  tensors = {k: np.asarray(v).astype(dtype) for k, v in param_files.named(params).items()}
  params = param_files.from_named(tensors, c.model, where=f"init_from={c.init_from}")
  log(f"parameters from init_from={c.init_from} ({len(tensors)} tensors)")
  return jax.device_put(params, shardings)


def _log(message: str) -> None:
  print(f"[rove_jax.train] {message}", file=sys.stderr, flush=True)
