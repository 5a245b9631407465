"""Parameter files: a GPT's parameters by name, and safetensors + config.json directories.

The GPT's parameters are an `nnx.State`; `named(params)` flattens it to {"blocks.0.attn.wqkv":
array, ...} (the module path joined by dots) and `from_named(tensors, config)` builds the
State back, checking every name and shape against the model the config builds, so a file of
another layout fails with the names it lacks and those it should not have.

Files are read and written with the `safetensors` package's numpy API (no torch), an optional
dependency imported where it is used: pip install 'rove_jax[interop]'. A checkpoint directory
holds `config.json` and `model.safetensors` (or transformers' sharded form: an index file
`model.safetensors.index.json` naming the shards). Writes go to a temporary name first and are
renamed when complete, so an interrupted export never leaves a truncated file under the final
name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Optional

import jax
import numpy as np
from flax import nnx

from rove_jax.nn.model import GPT

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def _safetensors_numpy():
  try:
    from safetensors import numpy as st_numpy
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        "reading and writing safetensors files needs the safetensors package: "
        "pip install 'rove_jax[interop]' (or pip install safetensors)", name="safetensors") from e
  return st_numpy


# ------------------------------------------------------------------------ named parameters


def _key_name(key) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _path_name(path) -> str:
  """"blocks.0.attn.wqkv" for the path of a Param's value (the trailing `.value` dropped)."""
  parts = [_key_name(k) for k in path]
  if parts and parts[-1] == "value":
    parts = parts[:-1]
  return ".".join(parts)


def abstract_params(config) -> nnx.State:
  """The parameter tree of the GPT a GPTConfig builds, shapes and dtypes only."""
  return nnx.state(nnx.eval_shape(lambda: GPT(config, rngs=nnx.Rngs(0))), nnx.Param)


def named(params) -> dict:
  """{dotted module path: numpy array} of a GPT's parameters (an nnx.State, e.g. from
  `nnx.state(model, nnx.Param)` or a checkpoint), copied to host memory."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  out = {_path_name(p): np.asarray(jax.device_get(leaf)) for p, leaf in leaves}
  if len(out) != len(leaves):
    raise ValueError("two parameters map to the same name")
  return out


def _show(names) -> str:
  names = sorted(names)
  return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")


def check_named(tensors: Mapping[str, Any], config, *, where: str = "the tensors"):
  """Checks {dotted name: array} against the GPT `config` builds; returns its abstract
  parameter tree.

  Raises:
    ValueError: names missing or unknown, or a shape or dtype that is not the model's.
  """
  abstract = abstract_params(config)
  want = {_path_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]}
  missing, unknown = set(want) - set(tensors), set(tensors) - set(want)
  if missing or unknown:
    raise ValueError(
        f"{where} do not match the model of this config: missing [{_show(missing)}], "
        f"unexpected [{_show(unknown)}]. Was the file written for another config or by another "
        f"version of rove-jax?")
  for name, leaf in want.items():
    t = tensors[name]
    if tuple(t.shape) != tuple(leaf.shape):
      raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}, the model needs "
                       f"{tuple(leaf.shape)}")
    if np.dtype(t.dtype) != np.dtype(leaf.dtype):
      raise ValueError(f"{where}: {name} is {np.dtype(t.dtype).name}, the config's param_dtype "
                       f"is {np.dtype(leaf.dtype).name}")
  return abstract


def from_named(tensors: Mapping[str, Any], config, *, where: str = "the tensors") -> nnx.State:
  """The nnx.State of the GPT `config` builds, filled from {dotted name: array} (`named`'s
  output). The arrays keep their dtype, which must be the config's param_dtype.

  Raises:
    ValueError: as `check_named`.
  """
  abstract = check_named(tensors, config, where=where)
  return jax.tree_util.tree_map_with_path(
      lambda p, leaf: jax.numpy.asarray(tensors[_path_name(p)]), abstract)


# ------------------------------------------------------------------------------ files


def read_config(path: str) -> dict:
  """The parsed config.json at `path` (a file or a directory holding one)."""
  if os.path.isdir(path):
    path = os.path.join(path, CONFIG)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no {CONFIG} at {path}: a checkpoint directory holds {CONFIG} "
                            f"beside {WEIGHTS}")
  with open(path) as f:
    try:
      config = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(config, dict):
    raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
  return config


def locate(path: str, config: Optional[str] = None, *,
           need_config: bool = True) -> tuple[list, Optional[str]]:
  """(safetensors files, config.json path) of a checkpoint: a directory (model.safetensors or
  a sharded index, config.json), or a .safetensors file whose config is `config` (default:
  the config.json beside it). need_config=False: a config the caller has (then None).

  Raises:
    FileNotFoundError: naming what is missing and where it was looked for.
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(path):
    single, index = os.path.join(path, WEIGHTS), os.path.join(path, WEIGHTS_INDEX)
    if os.path.isfile(single):
      files = [single]
    elif os.path.isfile(index):
      with open(index) as f:
        shards = sorted(set(json.load(f).get("weight_map", {}).values()))
      files = [os.path.join(path, s) for s in shards]
      absent = [f for f in files if not os.path.isfile(f)]
      if not shards or absent:
        raise FileNotFoundError(f"{index} names shards that are not there: {absent or 'none'}")
    else:
      torch_only = os.path.isfile(os.path.join(path, "pytorch_model.bin"))
      raise FileNotFoundError(
          f"{path} holds no {WEIGHTS} (nor {WEIGHTS_INDEX})" + (
              "; its pytorch_model.bin is a torch pickle, which is not read here: convert it "
              "with transformers (model.save_pretrained(dir, safe_serialization=True))"
              if torch_only else ""))
    config_path = config or os.path.join(path, CONFIG)
  elif os.path.isfile(path):
    files = [path]
    config_path = config or os.path.join(os.path.dirname(path), CONFIG)
  else:
    raise FileNotFoundError(f"no checkpoint at {path}: give a directory holding {CONFIG} and "
                            f"{WEIGHTS}, or a .safetensors file")
  if not need_config:
    return files, None
  if os.path.isdir(config_path):
    config_path = os.path.join(config_path, CONFIG)
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"no config for {path}: {config_path} does not exist (pass the "
                            f"config.json path as config=)")
  return files, config_path


def read_tensors(files) -> dict:
  """{name: numpy array} of one or more safetensors files (shards must not repeat a name)."""
  st = _safetensors_numpy()
  out: dict = {}
  for f in files:
    for name, array in st.load_file(f).items():
      if name in out:
        raise ValueError(f"tensor {name} appears in two shards (second: {f})")
      out[name] = array
  return out


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _replace_atomically(path: str, write) -> None:
  """write(tmp), then renames tmp to path; the file gets the mode an ordinary new file gets
  (safetensors itself creates files readable by their owner only)."""
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
  try:
    write(tmp)
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_checkpoint(out_dir: str, tensors: Mapping[str, np.ndarray], config: dict, *,
                     metadata: Optional[dict] = None) -> dict:
  """Writes out_dir/model.safetensors (the tensors, contiguous) and out_dir/config.json;
  returns {"config": path, "weights": path}. The weights are written first, so a directory
  whose config.json exists holds its complete weights."""
  st = _safetensors_numpy()
  os.makedirs(out_dir, exist_ok=True)
  weights, config_path = os.path.join(out_dir, WEIGHTS), os.path.join(out_dir, CONFIG)
  arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
  _replace_atomically(weights, lambda p: st.save_file(arrays, p, metadata=metadata))

  def write_json(p):
    with open(p, "w") as f:
      json.dump(config, f, indent=2)
      f.write("\n")
  _replace_atomically(config_path, write_json)
  return {"config": config_path, "weights": weights}
