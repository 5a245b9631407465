"""GPT-2 checkpoints in transformers' format, loaded into the GPT and written from it.

    config, params = load_gpt2("path/to/gpt2")  # config.json + model.safetensors
    model = rove_jax.nn.pretrained.build(config, params)  # logits = model(tokens)
    save_gpt2("out/", config, params)  # GPT2LMHeadModel.from_pretrained("out/") loads it

Paths are local or gs://bucket/path: files go through rove_jax.nn.param_files, which reads and
writes them with rove_jax.storage.paths (gs:// needs the [gcs] extra).

GPT-2 is the GPT with learned positions, LayerNorm with biases, the tanh-approximated GELU,
biases on every projection, fused q/k/v and (by default) a tied lm_head: all are GPTConfig
settings, so a GPT-2 checkpoint loads without a special model. The tensors map as

  transformers (GPT2LMHeadModel)          GPT (GPTConfig(pos_encoding="learned"))
  wte.weight        [V, E]                embed         [V, E]
  wpe.weight        [n_positions, E]      pos_embed     [max_len, E]
  h.i.ln_1.weight, .bias  [E]             blocks.i.norm1.scale, .bias  (ln_2: norm2)
  h.i.attn.c_attn.weight  [E, 3E]         blocks.i.attn.wqkv  [E, 3, H, D]
  h.i.attn.c_attn.bias    [3E]            blocks.i.attn.bqkv  [3, H, D]
  h.i.attn.c_proj.weight  [E, E]          blocks.i.attn.wo    [H, D, E]  (.bias: bo)
  h.i.mlp.c_fc.weight     [E, F]          blocks.i.mlp.w_in   [E, F]     (.bias: b_in)
  h.i.mlp.c_proj.weight   [F, E]          blocks.i.mlp.w_out  [F, E]     (.bias: b_out)
  ln_f.weight, .bias      [E]             final_norm.scale, .bias
  lm_head.weight    [V, E] (untied only)  lm_head       [E, V]

GPT-2's Conv1D layers store their weights [in, out] (y = x @ W), as the GPT does, so only an
untied lm_head (a torch Linear, [out, in]) is transposed. c_attn's 3E output columns are q,
k, v, each H heads of D consecutive columns, and c_proj reads the heads in that order: both
are reshapes. Names with or without transformers' "transformer." prefix are read; the
causal-mask buffers older checkpoints carry (h.i.attn.bias, h.i.attn.masked_bias) are
skipped; a tied checkpoint that also stores lm_head.weight must store wte's values there.

The config: n_embd, n_layer, n_head, n_positions, vocab_size as named (or transformers'
aliases hidden_size, ...), n_inner (None: 4 n_embd) -> d_ff, layer_norm_epsilon -> norm_eps,
tie_word_embeddings -> tie_embeddings, missing keys taking GPT2Config's defaults.
activation_function must be a tanh GELU ("gelu_new", "gelu_pytorch_tanh", "gelu_fast": one
function); the exact GELU and other activations, scale_attn_weights=false,
scale_attn_by_inverse_layer_idx and cross-attention are not what the GPT computes and are
refused (ValueError naming the key). reorder_and_upcast_attn only changes how float16 rounds
and is accepted. The parameters keep the checkpoint's dtype (param_dtype), the GPT computes in
float32.

`save_gpt2` writes a genuine GPT-2 checkpoint (config.json that GPT2Config reads, the tensors
under transformers' names with its "pt" metadata) for any GPTConfig that GPT-2 can express
(`gpt2_incompatibilities` lists why not otherwise), plus the full GPTConfig under the
config's "rove_jax" key, which transformers keeps as an unused attribute and `load_gpt2`
returns, so dtype, attention kernel and the other non-architectural settings round-trip.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional, Union

import numpy as np

from rove_jax.nn import param_files
from rove_jax.nn.model_config import DTYPES, GPTConfig

MODEL_TYPE = "gpt2"
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
PREFIX = "transformer."
# GPT2Config's defaults, for keys a config.json leaves out (transformers fills them the same).
DEFAULTS = dict(
  vocab_size=50257,
  n_positions=1024,
  n_embd=768,
  n_layer=12,
  n_head=12,
  n_inner=None,
  activation_function="gelu_new",
  layer_norm_epsilon=1e-5,
  scale_attn_weights=True,
  scale_attn_by_inverse_layer_idx=False,
  add_cross_attention=False,
  tie_word_embeddings=True,
  initializer_range=0.02,
)
ALIASES = {
  "n_embd": "hidden_size",
  "n_layer": "num_hidden_layers",
  "n_head": "num_attention_heads",
  "n_positions": "max_position_embeddings",
}
# The GPTConfig fields a GPT-2 config.json determines.
ARCHITECTURE = (
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
  "tie_embeddings",
  "norm_eps",
)
_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(masked_)?bias")


def _get(hf: Mapping, key: str):
  if key in hf:
    return hf[key]
  if ALIASES.get(key) in hf:
    return hf[ALIASES[key]]
  return DEFAULTS[key]


def config_from_gpt2(
  hf: Mapping, *, param_dtype: str = "float32", where: str = "config.json"
) -> GPTConfig:
  """The GPTConfig of a transformers GPT-2 config (the parsed config.json).

  A "rove_jax" section (written by `save_gpt2`) is returned as the config after checking
  that it describes the same architecture as the GPT-2 keys.

  Raises:
    ValueError: not a GPT-2 config, or a setting the GPT cannot compute (named).
  """
  if hf.get("model_type") != MODEL_TYPE:
    raise ValueError(
      f"{where} has model_type {hf.get('model_type')!r}; load_gpt2 reads GPT-2 "
      f"checkpoints (model_type 'gpt2'); rove_jax.nn.pretrained.load reads "
      f"rove-jax exports"
    )
  problems = []
  act = _get(hf, "activation_function")
  if act not in TANH_GELUS:
    problems.append(
      f"activation_function={act!r} (the GPT's MLP computes the tanh GELU, one of {TANH_GELUS})"
    )
  if not _get(hf, "scale_attn_weights"):
    problems.append("scale_attn_weights=false (the GPT scales logits by 1/sqrt(head_dim))")
  if _get(hf, "scale_attn_by_inverse_layer_idx"):
    problems.append("scale_attn_by_inverse_layer_idx=true")
  if _get(hf, "add_cross_attention"):
    problems.append("add_cross_attention=true (the GPT is decoder-only)")
  if problems:
    raise ValueError(f"{where}: GPT-2 settings the GPT cannot compute: {'; '.join(problems)}")
  d_model, n_inner = _get(hf, "n_embd"), _get(hf, "n_inner")
  fields = dict(
    vocab_size=_get(hf, "vocab_size"),
    n_layer=_get(hf, "n_layer"),
    n_head=_get(hf, "n_head"),
    d_model=d_model,
    d_ff=4 * d_model if n_inner is None else n_inner,
    max_len=_get(hf, "n_positions"),
    pos_encoding="learned",
    norm="layernorm",
    mlp="gelu",
    use_bias=True,
    tie_embeddings=bool(_get(hf, "tie_word_embeddings")),
    norm_eps=float(_get(hf, "layer_norm_epsilon")),
    init_std=float(_get(hf, "initializer_range")),
    param_dtype=param_dtype,
  )
  return param_files.model_config(hf, fields, ARCHITECTURE, where=where, keys="GPT-2")


def gpt2_incompatibilities(config: GPTConfig) -> list:
  """Why GPT-2 cannot express a GPTConfig (empty: it can)."""
  out = []
  if config.pos_encoding != "learned":
    out.append(f"pos_encoding={config.pos_encoding!r} (GPT-2 learns absolute positions)")
  if config.norm != "layernorm":
    out.append(f"norm={config.norm!r} (GPT-2 uses LayerNorm)")
  if config.mlp != "gelu":
    out.append(f"mlp={config.mlp!r} (GPT-2's MLP is a GELU MLP)")
  if not config.use_bias:
    out.append("use_bias=False (GPT-2 has biases)")
  if config.n_kv_head != config.n_head:
    out.append(f"n_kv_head={config.n_kv_head} < n_head={config.n_head} (GPT-2 has no GQA)")
  if config.sliding_window:
    out.append(f"sliding_window={config.sliding_window} (GPT-2 attends to every earlier token)")
  return out


def gpt2_config(config: GPTConfig) -> dict:
  """The config.json of a GPT-2 checkpoint of `config` (GPT2Config's keys, dropout off, and
  the full GPTConfig under "rove_jax").

  Raises:
    ValueError: GPT-2 cannot express the config (the reasons listed).
  """
  bad = gpt2_incompatibilities(config)
  if bad:
    raise ValueError(
      f"GPT-2's format cannot hold this model: {'; '.join(bad)}. Export it in "
      f"rove-jax's format instead (rove_jax.nn.pretrained.save, format='rove_jax')"
    )
  return {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": MODEL_TYPE,
    "vocab_size": config.vocab_size,
    "n_positions": config.max_len,
    "n_embd": config.d_model,
    "n_layer": config.n_layer,
    "n_head": config.n_head,
    "n_inner": config.d_ff,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": config.norm_eps,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
    "tie_word_embeddings": config.tie_embeddings,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "initializer_range": config.init_std,
    "bos_token_id": None,
    "eos_token_id": None,
    "dtype": config.param_dtype,
    "rove_jax": config.to_dict(),
  }


def _table(config: GPTConfig):
  """(GPT-2 name, its shape, GPT name, GPT shape) of every tensor; an untied lm_head is the
  one entry whose layouts differ by a transpose rather than a reshape."""
  V, E, F, P = config.vocab_size, config.d_model, config.d_ff, config.max_len
  H, D = config.n_head, config.head_dim
  rows = [("wte.weight", (V, E), "embed", (V, E)), ("wpe.weight", (P, E), "pos_embed", (P, E))]
  for i in range(config.n_layer):
    h, b = f"h.{i}.", f"blocks.{i}."
    for ln, norm in (("ln_1", "norm1"), ("ln_2", "norm2")):
      rows += [
        (h + ln + ".weight", (E,), b + norm + ".scale", (E,)),
        (h + ln + ".bias", (E,), b + norm + ".bias", (E,)),
      ]
    rows += [
      (h + "attn.c_attn.weight", (E, 3 * E), b + "attn.wqkv", (E, 3, H, D)),
      (h + "attn.c_attn.bias", (3 * E,), b + "attn.bqkv", (3, H, D)),
      (h + "attn.c_proj.weight", (E, E), b + "attn.wo", (H, D, E)),
      (h + "attn.c_proj.bias", (E,), b + "attn.bo", (E,)),
      (h + "mlp.c_fc.weight", (E, F), b + "mlp.w_in", (E, F)),
      (h + "mlp.c_fc.bias", (F,), b + "mlp.b_in", (F,)),
      (h + "mlp.c_proj.weight", (F, E), b + "mlp.w_out", (F, E)),
      (h + "mlp.c_proj.bias", (E,), b + "mlp.b_out", (E,)),
    ]
  rows += [
    ("ln_f.weight", (E,), "final_norm.scale", (E,)),
    ("ln_f.bias", (E,), "final_norm.bias", (E,)),
  ]
  if not config.tie_embeddings:
    rows.append(("lm_head.weight", (V, E), "lm_head", (E, V)))
  return rows


def header_shapes(shapes: Mapping[str, tuple], config: GPTConfig) -> tuple[dict, dict]:
  """(found, wanted) for checking a GPT-2 checkpoint's tensor shapes (from its safetensors
  headers, `shapes`: {name: shape}) before reading it: found without transformers' prefix, the
  attention-mask buffers and a tied checkpoint's lm_head.weight (loading compares its values
  with wte's), wanted the {name: shape} `config` needs."""
  found = {(n[len(PREFIX) :] if n.startswith(PREFIX) else n): tuple(s) for n, s in shapes.items()}
  found = {n: s for n, s in found.items() if not _MASK_BUFFER.fullmatch(n)}
  if config.tie_embeddings:
    found.pop("lm_head.weight", None)
  return found, {r[0]: r[1] for r in _table(config)}


def params_from_gpt2(
  tensors: Mapping[str, np.ndarray], config: GPTConfig, *, where: str = "the checkpoint"
):
  """The GPT's parameters (nnx.State) from GPT-2 tensors {transformers name: array}, cast to
  config.param_dtype.

  Raises:
    ValueError: names missing or unknown, a shape that is not the config's, or a tied
      checkpoint whose lm_head.weight differs from wte.weight.
  """
  by_name = {}
  for name, array in tensors.items():
    short = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    if short in by_name:
      raise ValueError(f"{where} holds {short} twice (with and without {PREFIX!r})")
    by_name[short] = array
  by_name = {n: a for n, a in by_name.items() if not _MASK_BUFFER.fullmatch(n)}
  if config.tie_embeddings and "lm_head.weight" in by_name:
    lm_head, wte = by_name.pop("lm_head.weight"), by_name.get("wte.weight")
    if wte is None or lm_head.shape != wte.shape or not np.array_equal(lm_head, wte):
      raise ValueError(
        f"{where}: config.json ties lm_head to wte (tie_word_embeddings), but "
        f"the file's lm_head.weight differs from wte.weight; set "
        f"tie_word_embeddings to false in config.json to load it untied"
      )
  table = _table(config)
  missing = sorted({r[0] for r in table} - set(by_name))
  unknown = sorted(set(by_name) - {r[0] for r in table})
  if missing or unknown:
    raise ValueError(
      f"{where} does not hold the tensors of its config.json's GPT-2 "
      f"(n_layer={config.n_layer}, tie_word_embeddings={config.tie_embeddings}): "
      f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''}, unexpected "
      f"{unknown[:6]}{' ...' if len(unknown) > 6 else ''}"
    )
  dtype = DTYPES[config.param_dtype]
  native = {}
  for hf_name, hf_shape, name, shape in table:
    array = by_name[hf_name]
    if tuple(array.shape) != hf_shape:
      raise ValueError(
        f"{where}: {hf_name} has shape {tuple(array.shape)}; its config.json says {hf_shape}"
      )
    array = array.T if name == "lm_head" else array.reshape(shape)
    native[name] = np.asarray(array).astype(dtype)
  return param_files.from_named(native, config, where=where)


def gpt2_tensors(params, config: GPTConfig, *, prefix: str = PREFIX) -> dict:
  """{transformers name: numpy array} of the GPT's parameters (the inverse of
  `params_from_gpt2`); names carry `prefix` as GPT2LMHeadModel.save_pretrained writes them,
  lm_head.weight (untied only) none."""
  bad = gpt2_incompatibilities(config)
  if bad:
    raise ValueError(f"GPT-2's format cannot hold this model: {'; '.join(bad)}")
  named = param_files.named(params)
  param_files.check_named(named, config, where="the parameters to export")
  out = {}
  for hf_name, hf_shape, name, _ in _table(config):
    array = named[name]
    out[("" if name == "lm_head" else prefix) + hf_name] = (
      array.T if name == "lm_head" else array.reshape(hf_shape)
    )
  return out


def load_gpt2(path, config: Union[str, Mapping, None] = None):
  """(GPTConfig, params) of a transformers GPT-2 checkpoint.

  Args:
    path: a directory holding config.json and model.safetensors (or a sharded
      model.safetensors.index.json), or a .safetensors file; local or gs://.
    config: for a file path, its config.json (a path or the parsed dict); default: the
      config.json beside the file.

  Raises:
    FileNotFoundError: no weights or no config where they should be.
    ValueError: not a GPT-2 config, a setting the GPT cannot compute, tensor names missing or
      unknown, or shapes that do not match the config (each names the problem).
  """
  given = isinstance(config, Mapping)
  files, config_path = param_files.locate(path, None if given else config, need_config=not given)
  hf, where = (
    (dict(config), "the config given")
    if given
    else (param_files.read_config(config_path), config_path)
  )
  cfg = config_from_gpt2(hf, where=where)  # before the tensors are read
  tensors = param_files.read_tensors(files)
  if hf.get("rove_jax") is None:
    wte = tensors.get("wte.weight", tensors.get(PREFIX + "wte.weight"))
    name = None if wte is None else np.dtype(wte.dtype).name
    if name in DTYPES and name != cfg.param_dtype:
      cfg = config_from_gpt2(hf, param_dtype=name, where=where)
  return cfg, params_from_gpt2(tensors, cfg, where=", ".join(files))


def save_gpt2(
  out_dir: str, config: GPTConfig, params, *, extra_config: Optional[Mapping] = None
) -> dict:
  """Writes a transformers GPT-2 checkpoint (config.json, model.safetensors) of the GPT to
  out_dir (local or gs://); returns {"config": path, "weights": path}. `extra_config`: more
  config.json keys
  (e.g. bos_token_id, eos_token_id), overriding the written ones.

  Raises:
    ValueError: GPT-2 cannot express the config (the reasons listed).
  """
  hf = {**gpt2_config(config), **(extra_config or {})}
  return param_files.write_checkpoint(
    out_dir, gpt2_tensors(params, config), hf, metadata={"format": "pt"}
  )


def is_gpt2_config(hf: Optional[Mapping]) -> bool:
  return isinstance(hf, Mapping) and hf.get("model_type") == MODEL_TYPE
