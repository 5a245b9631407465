"""A GPT's parameters and config as a directory of safetensors + config.json, for inference.

    save("out/", config, params)          # "auto": a transformers format where one fits
    config, params = load("out/")         # any format below, and transformers checkpoints of
                                          # model_type gpt2, llama, qwen2 and mistral
    model = build(config, params)         # -> rove_jax.nn.model.generate(model, prompt, ...)

Directories are local or gs://bucket/path (rove_jax.storage.paths; gs:// needs the [gcs]
extra): save("gs://bucket/exports/tiny", ...) and load("gs://bucket/exports/tiny") work alike.

An export holds the parameters only (no optimizer state, no data iterator), in these formats:

  "gpt2"      A genuine transformers GPT-2 checkpoint (rove_jax.nn.hf_gpt2): for a GPT with
              learned positions and GPT-2's other settings. transformers' GPT2LMHeadModel,
              and every tool that reads GPT-2 checkpoints, loads it.
  "llama", "qwen2", "mistral"
              A genuine transformers checkpoint of that model type (rove_jax.nn.hf_llama):
              for a RoPE GPT with the half rotary layout, RMSNorm and SwiGLU, and the type's
              biases and window (hf_llama.llama_incompatibilities says why not otherwise).
  "rove_jax"  Any GPT: the tensors under the GPT's own names and shapes ("blocks.0.attn.wqkv"
              [E, 3, H, D], `param_files.named`), bit for bit, and a config.json of
              model_type "rove_jax_gpt", a rove-jax extension described below.

Every config.json carries the full GPTConfig (`GPTConfig.to_dict()`) under "rove_jax",
which `load` returns, so a model loads back exactly as it was saved.

The rove-jax config.json (model_type "rove_jax_gpt", "rove_jax_format": 1) describes the
architecture with transformers' key names where one exists, so people and tools can read it
without rove-jax:
  vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
  head_dim, intermediate_size, max_position_embeddings, tie_word_embeddings, dtype (the
  parameters'), attention_bias (biases on the projections and LayerNorms), qkv_bias (biases
  on q, k, v even without attention_bias), sliding_window (None: every earlier token),
  hidden_act ("gelu_pytorch_tanh": a GELU MLP; "silu": SwiGLU, silu(x W_gate) * (x W_in)),
  norm ("layernorm" | "rmsnorm") with layer_norm_eps or rms_norm_eps,
  position_embedding_type (GPTConfig.pos_encoding: "rove", "rope", "nope", "learned",
  "sinusoidal", "t5_bias"); for the rotary ones also rope_theta, partial_rotary_factor,
  rope_scaling (transformers' dict, None: plain RoPE), rope_layout ("interleaved" pairs dims
  (2m, 2m + 1) as GPT-J does, "half" pairs (m, m + P) as Llama does), and
  rove (true: values are rotated too, RoVE: o_i = R_i^-1 sum_j a_ij R_j v_j) with rove_layers
  (the layers that use RoVE, None: all; the others use RoPE); for t5_bias t5_num_buckets and
  t5_max_distance.

What other tools can do with it: any safetensors reader reads the tensors;
`rove_jax.rope_from_hf_config` (and transformers' rope code, which reads the same keys) gets
the rotary frequencies of a RoPE or RoVE export from its config.json. What they cannot:
transformers' AutoModel does not know the model_type and refuses the directory, and no
transformers model rotates values, so a RoVE export runs only in rove-jax (or code that
implements the rove key as above); a RoPE export with layout "half" matches Llama's attention,
but its block (LayerNorm/bias options, tied head, fused q/k/v) is not any one transformers
architecture and is not converted here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

from rove_jax.nn import hf_gpt2, hf_llama, param_files
from rove_jax.nn import model as model_lib
from rove_jax.nn.model_config import ROTARY_ENCODINGS, GPTConfig
from rove_jax.storage import errors as storage_errors
from rove_jax.storage import paths as storage_paths

MODEL_TYPE = "rove_jax_gpt"
TOKENIZER_FILE = "tokenizer.json"  # a transformers directory's tokenizer; rove-export writes one
FORMAT_VERSION = 1
FORMATS = ("auto", "gpt2", *hf_llama.MODEL_TYPES, "rove_jax")


def rove_jax_config(config: GPTConfig) -> dict:
  """The config.json of a rove-jax export of `config` (keys in the module docstring)."""
  out = {
    "architectures": ["RoveJaxGPT"],
    "model_type": MODEL_TYPE,
    "rove_jax_format": FORMAT_VERSION,
    "vocab_size": config.vocab_size,
    "hidden_size": config.d_model,
    "num_hidden_layers": config.n_layer,
    "num_attention_heads": config.n_head,
    "num_key_value_heads": config.n_kv_head,
    "head_dim": config.head_dim,
    "intermediate_size": config.d_ff,
    "max_position_embeddings": config.max_len,
    "hidden_act": "silu" if config.mlp == "swiglu" else "gelu_pytorch_tanh",
    "norm": config.norm,
    ("rms_norm_eps" if config.norm == "rmsnorm" else "layer_norm_eps"): config.norm_eps,
    "attention_bias": config.use_bias,
    "qkv_bias": config.qkv_bias,
    "sliding_window": config.sliding_window or None,
    "tie_word_embeddings": config.tie_embeddings,
    "dtype": config.param_dtype,
    "position_embedding_type": config.pos_encoding,
  }
  if config.pos_encoding in ROTARY_ENCODINGS:
    out.update(
      rope_theta=config.rope_base,
      partial_rotary_factor=config.rotary_fraction,
      rope_scaling=None if config.rope_scaling is None else config.rope_scaling.to_dict(),
      rope_layout=config.rope_layout,
      rove=config.pos_encoding == "rove",
      rove_layers=None if config.rove_layers is None else list(config.rove_layers),
    )
  if config.pos_encoding == "t5_bias":
    out.update(t5_num_buckets=config.t5_num_buckets, t5_max_distance=config.t5_max_distance)
  out["rove_jax"] = config.to_dict()
  return out


def _config_from_rove_jax(hf: Mapping, where: str) -> GPTConfig:
  version = hf.get("rove_jax_format")
  if version != FORMAT_VERSION:
    raise ValueError(
      f"{where}: rove_jax_format {version!r} is not {FORMAT_VERSION}, the one "
      f"this version of rove-jax reads"
    )
  if not isinstance(hf.get("rove_jax"), Mapping):
    raise ValueError(
      f"{where}: a rove-jax export keeps its GPTConfig under 'rove_jax'; it is missing"
    )
  try:
    config = GPTConfig.from_dict(hf["rove_jax"])
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where}: {e}") from None
  described = rove_jax_config(config)
  differ = [k for k, v in hf.items() if k != "rove_jax" and k in described and described[k] != v]
  if differ:
    raise ValueError(
      f"{where}: its keys {differ} disagree with its rove_jax section (edited by "
      f"hand?); the rove_jax section is what rove-jax builds: fix one of them"
    )
  return config


def resolve_format(config: GPTConfig, format: str = "auto") -> str:
  """The format `save` writes: one of FORMATS but "auto", which is GPT-2's where it fits,
  else the first of llama, qwen2, mistral that fits, else rove-jax's.

  Raises:
    ValueError: an unknown format, or a transformers format that cannot hold the model.
  """
  if format not in FORMATS:
    raise ValueError(f"unknown export format {format!r}; expected one of {FORMATS}")
  if format == "auto":
    if not hf_gpt2.gpt2_incompatibilities(config):
      return "gpt2"
    return hf_llama.fitting_type(config) or "rove_jax"
  bad = (
    hf_gpt2.gpt2_incompatibilities(config)
    if format == "gpt2"
    else hf_llama.llama_incompatibilities(config, format)
    if format in hf_llama.MODEL_TYPES
    else []
  )
  if bad:
    name = "GPT-2" if format == "gpt2" else format
    raise ValueError(
      f"{name}'s format cannot hold this model: {'; '.join(bad)}. Export it in "
      f"rove-jax's format (format='rove_jax' or 'auto')"
    )
  return format


def save(
  out_dir: str,
  config: GPTConfig,
  params,
  *,
  format: str = "auto",
  extra_config: Optional[Mapping] = None,
) -> dict:
  """Exports the GPT's parameters to out_dir (config.json, model.safetensors), a local
  directory or gs://bucket/path.

  Args:
    format: "gpt2", "llama", "qwen2", "mistral", "rove_jax", or "auto" (`resolve_format`:
      a transformers format where one holds the model, else rove-jax's).
    extra_config: more config.json keys (e.g. provenance; readers ignore unknown keys), which
      override the written ones of the same name.

  Returns:
    {"format": the format written, "config": path, "weights": path}.

  Raises:
    ValueError: an unknown format, or a transformers format that cannot hold the model, or
      parameters that are not the config's model (all before anything is written).
    OSError: out_dir cannot be written (permissions, disk full, storage errors).
    paths.MissingExtra (an ImportError): a gs:// out_dir without gcsfs.
  """
  format = resolve_format(config, format)
  if format == "gpt2":  # checks the parameters as below
    paths = hf_gpt2.save_gpt2(out_dir, config, params, extra_config=extra_config)
  elif format in hf_llama.MODEL_TYPES:
    paths = hf_llama.save_llama(
      out_dir, config, params, model_type=format, extra_config=extra_config
    )
    paths.pop("model_type")
  else:
    tensors = param_files.named(params)
    param_files.check_named(tensors, config, where="the parameters to export")
    paths = param_files.write_checkpoint(
      out_dir,
      tensors,
      {**rove_jax_config(config), **(extra_config or {})},
      metadata={"format": "rove_jax"},
    )
  return {"format": format, **paths}


def read_config(path: str) -> tuple[GPTConfig, dict]:
  """(GPTConfig, the parsed config.json) of a checkpoint directory `load` reads (any format
  above), from its config.json alone: no tensor is read, so a caller can check a model's
  architecture before any work. The GPTConfig's param_dtype is float32 for a transformers
  checkpoint (`load` takes the tensors' dtype).

  Raises:
    FileNotFoundError: no weights or no config.json. ValueError: as `load`.
  """
  _, config_path = param_files.locate(path)
  hf = param_files.read_config(config_path)
  if hf_gpt2.is_gpt2_config(hf):
    return hf_gpt2.config_from_gpt2(hf, where=config_path), hf
  if hf_llama.is_llama_config(hf):
    return hf_llama.config_from_llama(hf, where=config_path), hf
  if hf.get("model_type") != MODEL_TYPE:
    raise ValueError(
      f"{config_path} has model_type {hf.get('model_type')!r}; rove-jax loads "
      f"transformers' {(hf_gpt2.MODEL_TYPE, *hf_llama.MODEL_TYPES)} and "
      f"'{MODEL_TYPE}' (its own exports)"
    )
  return _config_from_rove_jax(hf, config_path), hf


def check_files(path: str) -> tuple[GPTConfig, dict]:
  """(GPTConfig, the parsed config.json) of a checkpoint directory (`read_config`), after
  checking its files without reading a tensor: the index file and every safetensors header
  (`param_files.read_header`: lengths, offsets, dtypes), and the tensors' names and shapes (and
  for a rove-jax export their dtype) against the model its config.json describes. For callers
  that must refuse a damaged checkpoint before any work (init_from).

  Raises:
    FileNotFoundError: no weights or no config.json.
    ValueError: one line naming the file and what is wrong.
  """
  files, _ = param_files.locate(path)
  config, hf = read_config(path)
  headers = param_files.read_headers(files)
  where = files[0] if len(files) == 1 else f"the {len(files)} shards of {path}"
  shapes = {name: shape for name, (_, shape) in headers.items()}
  if hf_gpt2.is_gpt2_config(hf):
    found, wanted = hf_gpt2.header_shapes(shapes, config)
  elif hf_llama.is_llama_config(hf):
    found, wanted = hf_llama.header_shapes(shapes, config)
  else:
    found = shapes
    wanted = {
      name: tuple(leaf.shape)
      for name, leaf in param_files.named_leaves(model_lib.abstract_params(config)).items()
    }
    for name, (dtype, _) in headers.items():
      if param_files.NUMPY_NAMES.get(dtype) != config.param_dtype:
        raise ValueError(
          f"{where}: {name} is {dtype}, its config.json's param_dtype is {config.param_dtype}"
        )
  missing, unknown = sorted(set(wanted) - set(found)), sorted(set(found) - set(wanted))
  if missing or unknown:
    raise ValueError(
      f"{where} does not hold the tensors of its config.json's model: missing "
      f"{missing[:6]}{' ...' * (len(missing) > 6)}, unexpected "
      f"{unknown[:6]}{' ...' * (len(unknown) > 6)}"
    )
  for name, shape in wanted.items():
    if found[name] != tuple(shape):
      raise ValueError(
        f"{where}: {name} has shape {found[name]}; its config.json says {tuple(shape)}"
      )
  return config, hf


@dataclasses.dataclass(frozen=True)
class Inspected:
  """A checkpoint directory as `inspect` found it (tensors unread)."""

  path: str
  model: GPTConfig  # its config.json's
  tokenizer: Optional[str]  # its tokenizer file, or the spec it records, or None


def inspect(path: str, *, where: Optional[str] = None, check: bool = False) -> Inspected:
  """The model and the tokenizer of the checkpoint at `path`, tensors unread: its config.json's
  model (`read_config`; `check_files` too when `check`, so that a damaged file is refused before
  any work), and its tokenizer: the file its "rove_jax_run" record names (rove-export writes it
  beside the weights), else a tokenizer.json beside the weights (transformers' directories),
  else the spec an export of a byte or tiktoken run records, else None.

  Raises:
    ValueError: one line starting with `where` (default: the path) naming what is wrong: no
      weights or config.json, a damaged file, a malformed tokenizer record.
    OSError: storage that failed (storage_errors.is_unavailable: a deadline passed, a server
      error), its message starting with `where`.
  """
  where = where or path
  try:
    model, hf = (check_files if check else read_config)(path)
  except (OSError, ValueError) as e:
    raise storage_errors.input_error(e, f"{where}: {e}") from None
  directory = storage_paths.dirname(path) if storage_paths.isfile(path) else path
  run = hf.get("rove_jax_run")
  recorded = (run.get("tokenizer") if isinstance(run, dict) else None) or {}
  if not isinstance(recorded, dict):
    raise ValueError(f"{where}: rove_jax_run.tokenizer in its config.json is not an object")
  file = storage_paths.inside(
    directory, recorded.get("file") or TOKENIZER_FILE, what=f"{where}: rove_jax_run.tokenizer.file"
  )
  if storage_paths.isfile(file):
    return Inspected(path, model, file)
  if recorded.get("spec") and not recorded.get("file"):
    return Inspected(path, model, recorded["spec"])
  return Inspected(path, model, None)


def load(path, config=None):
  """(GPTConfig, params) of an export (any format) or of a transformers checkpoint of
  model_type gpt2, llama, qwen2 or mistral (single or sharded safetensors):
  a directory, or a .safetensors file with its config (`config`: a config.json path or the
  parsed dict; default: the config.json beside the file). Paths are local or gs://.

  Raises:
    FileNotFoundError: no weights or no config.
    ValueError: a config of another model type, settings the GPT cannot compute (named by
      key), or tensors that do not match the config.
    paths.MissingExtra (an ImportError): a gs:// path without gcsfs.
  """
  given = isinstance(config, Mapping)
  files, config_path = param_files.locate(path, None if given else config, need_config=not given)
  hf, where = (
    (dict(config), "the config given")
    if given
    else (param_files.read_config(config_path), config_path)
  )
  if hf_gpt2.is_gpt2_config(hf):
    return hf_gpt2.load_gpt2(path, config)
  if hf_llama.is_llama_config(hf):
    return hf_llama.load_llama(path, config)
  if hf.get("model_type") != MODEL_TYPE:
    raise ValueError(
      f"{where} has model_type {hf.get('model_type')!r}; rove-jax loads "
      f"transformers' {(hf_gpt2.MODEL_TYPE, *hf_llama.MODEL_TYPES)} and "
      f"'{MODEL_TYPE}' (its own exports)"
    )
  cfg = _config_from_rove_jax(hf, where)
  tensors = param_files.read_tensors(files)
  return cfg, param_files.from_named(tensors, cfg, where=", ".join(files))


# The GPT of a config with the given parameters, nothing initialised: `build(*load(path))`.
build = model_lib.build
