"""Llama-family checkpoints in transformers' format (llama, qwen2, mistral), loaded into the GPT
and written from it.

    config, params = load_llama("path/to/checkpoint")  # config.json + safetensors (or shards)
    model = rove_jax.nn.pretrained.build(config, params)  # logits = model(tokens)
    save_llama("out/", config, params)  # AutoModelForCausalLM.from_pretrained("out/") loads it

Paths are local or gs://bucket/path (rove_jax.nn.param_files reads and writes the files).

The three are one block: RMSNorm -> q, k, v -> RoPE with Llama's pairing of dims (m, m + P)
-> o -> RMSNorm -> SwiGLU (down(silu(gate(x)) * up(x))), no biases but where noted, grouped
kv heads. All of it is GPTConfig settings: pos_encoding="rope", rope_layout="half",
norm="rmsnorm", mlp="swiglu". They differ in
  llama    attention_bias: biases on q, k, v and o (use_bias=True; mlp_bias is refused)
  qwen2    biases on q, k, v only (qkv_bias=True, use_bias=False); sliding windows only if
           every layer has one (layer_types)
  mistral  no biases; sliding_window -> GPTConfig.sliding_window on every layer

The rotary setup (rope_theta, rope_parameters or rope_scaling) is read by rove_jax.hf_rope; the
rope types whose table rove-jax computes as transformers does for a whole sequence are taken
(ROPE_TYPES); any other type, unread keys in the rope dict, partial rotary factors, a head_dim
other than hidden_size / num_attention_heads, an activation other than silu and mlp_bias are
refused (ValueError naming the keys). How the tensors map to the GPT's parameters:
rove_jax.nn.hf_llama_tensors (params_from_llama, llama_tensors and header_shapes are also this
module's).

`save_llama` writes config.json as transformers 5 writes it (rope_parameters holding
rope_theta) with the full GPTConfig under "rove_jax" (transformers keeps it as an unused
attribute; `load_llama` returns it after checking it against the architecture keys), and the
tensors under transformers' names; `llama_incompatibilities` says why a GPTConfig does not fit
a type (RoVE never does: no transformers model rotates values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional, Union

import numpy as np

from rove_jax import hf_rope
from rove_jax.nn import param_files
from rove_jax.nn.hf_llama_tensors import (  # noqa: F401 - header_shapes: also this module's
  header_shapes,
  llama_tensors,
  params_from_llama,
)
from rove_jax.nn.model_config import DTYPES, GPTConfig

MODEL_TYPES = ("llama", "qwen2", "mistral")
ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "mistral": "MistralForCausalLM",
}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
REQUIRED = (
  "vocab_size",
  "hidden_size",
  "intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
  "max_position_embeddings",
)
# The GPTConfig fields a config.json determines (a "rove_jax" section must agree on them).
ARCHITECTURE = (
  "vocab_size",
  "n_layer",
  "n_head",
  "n_kv_head",
  "d_model",
  "d_ff",
  "max_len",
  "pos_encoding",
  "rope_base",
  "rotary_fraction",
  "rope_layout",
  "rope_scaling",
  "norm",
  "mlp",
  "use_bias",
  "qkv_bias",
  "tie_embeddings",
  "norm_eps",
  "sliding_window",
)


def is_llama_config(hf: Optional[Mapping]) -> bool:
  return isinstance(hf, Mapping) and hf.get("model_type") in MODEL_TYPES


def _window(hf: Mapping, model_type: str, problems: list) -> int:
  """The sliding window every layer uses (0: none), as transformers decides it."""
  if model_type == "llama":
    return 0
  if model_type == "mistral":  # MistralConfig's default window is 4096
    window = hf.get("sliding_window", 4096)
    return 0 if window is None else int(window)
  window = hf.get("sliding_window")
  kinds = hf.get("layer_types")
  if kinds is None:  # Qwen2Config: windows from layer max_window_layers on, if switched on
    on = bool(hf.get("use_sliding_window", False)) and window is not None
    first = hf.get("max_window_layers", 28)
    kinds = [
      "sliding_attention" if on and i >= first else "full_attention"
      for i in range(hf["num_hidden_layers"])
    ]
  unknown = sorted(set(kinds) - {"full_attention", "sliding_attention"})
  if unknown:
    problems.append(f"layer_types {unknown} (known: full_attention, sliding_attention)")
  elif len(set(kinds)) > 1:
    problems.append(
      "layer_types mixing full and sliding attention (the GPT gives every layer "
      "one mask; sliding_window, use_sliding_window, max_window_layers)"
    )
  elif kinds and kinds[0] == "sliding_attention":
    if not window:
      problems.append("layer_types says sliding_attention but sliding_window is unset")
    return int(window or 0)
  return 0


def _rope(hf: Mapping, problems: list):
  """(rope_base, rope_scaling or None) of the config, or (None, None) with a problem noted."""
  try:
    rope = hf_rope.rope_from_hf_config(hf, strict=True)
  except ValueError as e:
    problems.append(f"rope_parameters / rope_scaling: {e}")
    return None, None
  spec = rope.rope_scaling
  if spec.rope_type not in ROPE_TYPES:
    problems.append(f"rope_type={spec.rope_type!r} (rove-jax loads {ROPE_TYPES} from these models)")
  if spec.partial_rotary_factor not in (None, 1.0) or rope.rot_dim != rope.head_dim:
    problems.append(
      f"partial_rotary_factor={spec.partial_rotary_factor} (these models rotate the whole head)"
    )
  theta = spec.rope_theta
  rest = dataclasses.replace(spec, rope_theta=None, partial_rotary_factor=None)
  return theta, None if rest.to_dict() == {"rope_type": "default"} else rest


def config_from_llama(
  hf: Mapping, *, param_dtype: str = "float32", where: str = "config.json"
) -> GPTConfig:
  """The GPTConfig of a transformers llama, qwen2 or mistral config (the parsed config.json).

  Raises:
    ValueError: another model type, a missing key, or settings the GPT cannot compute (each
      named by its key).
  """
  model_type = hf.get("model_type")
  if model_type not in MODEL_TYPES:
    raise ValueError(f"{where} has model_type {model_type!r}; load_llama reads {MODEL_TYPES}")
  missing = [k for k in REQUIRED if hf.get(k) is None]
  if missing:
    raise ValueError(f"{where}: the {model_type} config lacks {missing}")
  problems = []
  E, H = hf["hidden_size"], hf["num_attention_heads"]
  if hf.get("hidden_act", "silu") != "silu":
    problems.append(f"hidden_act={hf['hidden_act']!r} (the GPT's SwiGLU uses silu)")
  if hf.get("head_dim") not in (None, E // H) or E % H:
    problems.append(
      f"head_dim={hf.get('head_dim')} with hidden_size={E}, "
      f"num_attention_heads={H} (the GPT's head_dim is hidden_size / heads)"
    )
  if hf.get("mlp_bias"):
    problems.append("mlp_bias=true (the GPT's SwiGLU has no biases)")
  for key in ("attn_logit_softcapping", "final_logit_softcapping", "use_qk_norm"):
    if hf.get(key):
      problems.append(f"{key}={hf[key]!r}")
  window = _window(hf, model_type, problems)
  theta, rope_scaling = _rope(hf, problems)
  if problems:
    raise ValueError(
      f"{where}: {model_type} settings the GPT cannot compute: {'; '.join(problems)}"
    )
  kv = hf.get("num_key_value_heads") or H
  fields = dict(
    vocab_size=hf["vocab_size"],
    n_layer=hf["num_hidden_layers"],
    n_head=H,
    n_kv_head=kv,
    d_model=E,
    d_ff=hf["intermediate_size"],
    max_len=hf["max_position_embeddings"],
    pos_encoding="rope",
    rope_base=float(theta),
    rope_layout="half",
    rope_scaling=rope_scaling,
    norm="rmsnorm",
    mlp="swiglu",
    use_bias=model_type == "llama" and bool(hf.get("attention_bias", False)),
    qkv_bias=model_type == "qwen2",
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    sliding_window=window,
    init_std=float(hf.get("initializer_range", 0.02)),
    param_dtype=param_dtype,
  )
  return param_files.model_config(hf, fields, ARCHITECTURE, where=where, keys=model_type)


def llama_incompatibilities(config: GPTConfig, model_type: str) -> list:
  """Why a transformers model of `model_type` cannot hold a GPTConfig (empty: it can)."""
  out = []
  if config.pos_encoding != "rope":
    out.append(
      f"pos_encoding={config.pos_encoding!r} ({model_type} uses RoPE; no transformers "
      f"model rotates values as RoVE does)"
    )
  if config.rope_layout != "half":
    out.append(f"rope_layout={config.rope_layout!r} ({model_type} pairs dims (m, m + P))")
  if config.rotary_fraction != 1.0:
    out.append(f"rotary_fraction={config.rotary_fraction} ({model_type} rotates whole heads)")
  if config.rope_scaling is not None and config.rope_scaling.rope_type not in ROPE_TYPES:
    out.append(f"rope_scaling type {config.rope_scaling.rope_type!r} (written: {ROPE_TYPES})")
  if config.norm != "rmsnorm":
    out.append(f"norm={config.norm!r} ({model_type} uses RMSNorm)")
  if config.mlp != "swiglu":
    out.append(f"mlp={config.mlp!r} ({model_type}'s MLP is SwiGLU)")
  qkv_only = config.qkv_bias and not config.use_bias
  if model_type == "llama" and qkv_only:
    out.append("qkv_bias without use_bias (Llama's attention_bias covers o too; qwen2 fits)")
  if model_type == "qwen2" and not qkv_only:
    out.append("use_bias or no qkv_bias (Qwen2 has biases on q, k, v and nowhere else)")
  if model_type == "mistral" and (config.use_bias or config.qkv_bias):
    out.append("biases (Mistral has none)")
  if model_type != "mistral" and config.sliding_window:
    out.append(f"sliding_window={config.sliding_window} (written for mistral only)")
  return out


def fitting_type(config: GPTConfig) -> Optional[str]:
  """The first of MODEL_TYPES that can hold the config, or None."""
  return next((t for t in MODEL_TYPES if not llama_incompatibilities(config, t)), None)


def llama_config(config: GPTConfig, model_type: str) -> dict:
  """The config.json of a `model_type` checkpoint of `config` (transformers 5's keys, dropout
  off, the full GPTConfig under "rove_jax").

  Raises:
    ValueError: the type cannot hold the config (the reasons listed).
  """
  bad = llama_incompatibilities(config, model_type)
  if bad:
    raise ValueError(f"{model_type}'s format cannot hold this model: {'; '.join(bad)}")
  rope = {
    "rope_type": "default",
    **(config.rope_scaling.to_dict() if config.rope_scaling else {}),
    "rope_theta": config.rope_base,
  }
  out = {
    "architectures": [ARCHITECTURES[model_type]],
    "model_type": model_type,
    "vocab_size": config.vocab_size,
    "hidden_size": config.d_model,
    "intermediate_size": config.d_ff,
    "num_hidden_layers": config.n_layer,
    "num_attention_heads": config.n_head,
    "num_key_value_heads": config.n_kv_head,
    "head_dim": config.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": config.max_len,
    "rms_norm_eps": config.norm_eps,
    "rope_parameters": rope,
    "tie_word_embeddings": config.tie_embeddings,
    "attention_dropout": 0.0,
    "initializer_range": config.init_std,
    "bos_token_id": None,
    "eos_token_id": None,
    "dtype": config.param_dtype,
  }
  if model_type == "llama":
    out.update(attention_bias=config.use_bias, mlp_bias=False)
  elif model_type == "qwen2":
    out.update(
      use_sliding_window=False,
      sliding_window=None,
      max_window_layers=config.n_layer,
      layer_types=["full_attention"] * config.n_layer,
    )
  else:
    out.update(sliding_window=config.sliding_window or None)
  out["rove_jax"] = config.to_dict()
  return out


def load_llama(path, config: Union[str, Mapping, None] = None):
  """(GPTConfig, params) of a transformers llama, qwen2 or mistral checkpoint.

  Args:
    path: a directory holding config.json and model.safetensors (or a sharded
      model.safetensors.index.json), or a .safetensors file; local or gs://.
    config: for a file path, its config.json (a path or the parsed dict); default: the
      config.json beside the file.

  Raises:
    FileNotFoundError: no weights or no config where they should be.
    ValueError: another model type, a setting the GPT cannot compute, tensor names missing or
      unknown, or shapes that do not match the config (each names the problem).
  """
  given = isinstance(config, Mapping)
  files, config_path = param_files.locate(path, None if given else config, need_config=not given)
  hf, where = (
    (dict(config), "the config given")
    if given
    else (param_files.read_config(config_path), config_path)
  )
  cfg = config_from_llama(hf, where=where)  # before the tensors are read
  tensors = param_files.read_tensors(files)
  if hf.get("rove_jax") is None:  # keep the checkpoint's dtype where the GPT has it
    embed = tensors.get("model.embed_tokens.weight")
    name = None if embed is None else np.dtype(embed.dtype).name
    if name in DTYPES and name != cfg.param_dtype:
      cfg = config_from_llama(hf, param_dtype=name, where=where)
  return cfg, params_from_llama(tensors, cfg, where=", ".join(files))


def save_llama(
  out_dir: str,
  config: GPTConfig,
  params,
  *,
  model_type: Optional[str] = None,
  extra_config: Optional[Mapping] = None,
) -> dict:
  """Writes a transformers checkpoint (config.json, model.safetensors) of the GPT to out_dir
  (local or gs://) as `model_type` (None: the first of MODEL_TYPES that fits); returns
  {"config": path, "weights": path, "model_type": the type written}.

  Raises:
    ValueError: the type cannot hold the config (the reasons listed), or no type can.
  """
  if model_type is None:
    model_type = fitting_type(config)
    if model_type is None:
      reasons = "; ".join(
        f"{t}: {', '.join(llama_incompatibilities(config, t))}" for t in MODEL_TYPES
      )
      raise ValueError(f"no Llama-family format holds this model ({reasons})")
  if model_type not in MODEL_TYPES:
    raise ValueError(f"unknown model_type {model_type!r}; expected one of {MODEL_TYPES}")
  hf = {**llama_config(config, model_type), **(extra_config or {})}
  paths = param_files.write_checkpoint(
    out_dir, llama_tensors(params, config), hf, metadata={"format": "pt"}
  )
  return {**paths, "model_type": model_type}
