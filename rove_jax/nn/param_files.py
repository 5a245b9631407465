"""Parameter files: a GPT's parameters by name, and safetensors + config.json directories.

The GPT's parameters are an `nnx.State`; `named(params)` flattens it to {"blocks.0.attn.wqkv":
array, ...} (the module path joined by dots) and `from_named(tensors, config)` builds the
State back, checking every name and shape against the model the config builds, so a file of
another layout fails with the names it lacks and those it should not have.

Files are read and written with the `safetensors` package's numpy API (no torch), an optional
dependency imported where it is used: pip install 'rove_jax[interop]'. A checkpoint directory
holds `config.json` and `model.safetensors` (or transformers' sharded form: an index file
`model.safetensors.index.json` naming the shards). Directories are local or gs://bucket/path,
reached through rove_jax.storage.paths (gs:// needs the [gcs] extra). Every file is replaced
whole (a temporary file renamed locally, one upload on GCS), so an interrupted export never
leaves a truncated file under the final name.

What is read comes from outside and is checked before it is used: every safetensors header
(`read_header`: its length against the file, dtypes, offsets against shapes) before the file
is loaded, the index file's form, and every shard it names is inside its directory
(`paths.inside`); each problem is one ValueError naming the file.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any, Optional

import jax
import numpy as np
from flax import nnx

from rove_jax.nn.model import abstract_params
from rove_jax.nn.model_config import GPTConfig
from rove_jax.storage import paths

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def _safetensors_numpy():
  try:
    from safetensors import numpy as st_numpy
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
      "reading and writing safetensors files needs the safetensors package: "
      "pip install 'rove_jax[interop]' (or pip install safetensors)",
      name="safetensors",
    ) from e
  return st_numpy


# ------------------------------------------------------------------------ named parameters


def _key_name(key) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _path_name(path) -> str:
  """ "blocks.0.attn.wqkv" for the path of a Param's value (the trailing `.value` dropped)."""
  parts = [_key_name(k) for k in path]
  if parts and parts[-1] == "value":
    parts = parts[:-1]
  return ".".join(parts)


def named_leaves(tree) -> dict:
  """{dotted module path: leaf} of a parameter tree (abstract or not), leaves as they are."""
  return {_path_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


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
      f"version of rove-jax?"
    )
  for name, leaf in want.items():
    t = tensors[name]
    if tuple(t.shape) != tuple(leaf.shape):
      raise ValueError(
        f"{where}: {name} has shape {tuple(t.shape)}, the model needs {tuple(leaf.shape)}"
      )
    if np.dtype(t.dtype) != np.dtype(leaf.dtype):
      raise ValueError(
        f"{where}: {name} is {np.dtype(t.dtype).name}, the config's param_dtype "
        f"is {np.dtype(leaf.dtype).name}"
      )
  return abstract


def from_named(tensors: Mapping[str, Any], config, *, where: str = "the tensors") -> nnx.State:
  """The nnx.State of the GPT `config` builds, filled from {dotted name: array} (`named`'s
  output). The arrays keep their dtype, which must be the config's param_dtype.

  Raises:
    ValueError: as `check_named`.
  """
  abstract = check_named(tensors, config, where=where)
  return jax.tree_util.tree_map_with_path(
    lambda p, leaf: jax.numpy.asarray(tensors[_path_name(p)]), abstract
  )


# ------------------------------------------------------------------------------ files


def read_config(path: str) -> dict:
  """The parsed config.json at `path` (a file or a directory holding one; local or gs://)."""
  path = paths.resolve(path, what="config")
  if paths.isdir(path):
    path = paths.join(path, CONFIG)
  if not paths.isfile(path):
    raise FileNotFoundError(
      f"no {CONFIG} at {path}: a checkpoint directory holds {CONFIG} beside {WEIGHTS}"
    )
  try:
    config = json.loads(paths.read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(config, dict):
    raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
  return config


def model_config(hf: Mapping, fields: dict, architecture, *, where: str, keys: str) -> GPTConfig:
  """The GPTConfig of a transformers config.json whose keys translate to `fields`: built from
  them, or the full GPTConfig in its "rove_jax" section (what rove-jax's exports add), which
  must agree with them on the `architecture` fields.

  Raises:
    ValueError: invalid fields, or a rove_jax section that describes another model (named by
      `keys`, e.g. "GPT-2", in the message).
  """
  try:
    derived = GPTConfig(**fields)
    stored = None if hf.get("rove_jax") is None else GPTConfig.from_dict(hf["rove_jax"])
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where}: {e}") from None
  if stored is None:
    return derived
  differ = [
    f"{f} ({getattr(stored, f)!r} vs {getattr(derived, f)!r})"
    for f in architecture
    if getattr(stored, f) != getattr(derived, f)
  ]
  if differ:
    raise ValueError(
      f"{where}: its rove_jax section and its {keys} keys describe different "
      f"models: {', '.join(differ)}. Was it edited by hand? Delete the rove_jax "
      f"section to load it as the {keys} keys say."
    )
  return stored


def locate(
  path: str, config: Optional[str] = None, *, need_config: bool = True
) -> tuple[list, Optional[str]]:
  """(safetensors files, config.json path) of a checkpoint: a directory (model.safetensors or
  a sharded index, config.json), or a .safetensors file whose config is `config` (default:
  the config.json beside it). need_config=False: a config the caller has (then None). Paths
  are local or gs:// (rove_jax.storage.paths; gs:// needs the [gcs] extra).

  Raises:
    FileNotFoundError: naming what is missing and where it was looked for.
    paths.MissingExtra: a gs:// path without gcsfs installed.
  """
  path = paths.resolve(path, what="checkpoint")
  if paths.isdir(path):
    single, index = paths.join(path, WEIGHTS), paths.join(path, WEIGHTS_INDEX)
    if paths.isfile(single):
      files = [single]
    elif paths.isfile(index):
      files = sorted(set(read_index(index).values()))
      absent = [f for f in files if not paths.isfile(f)]
      if not files or absent:
        raise FileNotFoundError(f"{index} names shards that are not there: {absent or 'none'}")
    else:
      if paths.isfile(paths.join(path, "pytorch_model.bin")):
        hint = (
          "; its pytorch_model.bin is a torch pickle, which is not read here: convert it "
          "with transformers (model.save_pretrained(dir, safe_serialization=True))"
        )
      elif not paths.isfile(paths.join(path, CONFIG)):  # e.g. a training run's directory
        hint = (
          f": it is not a model directory ({CONFIG} and {WEIGHTS}, as transformers' "
          f"save_pretrained and rove-export write them); a rove-train workdir becomes one "
          f"with rove-export --workdir {path} --out DIR"
        )
      else:
        hint = ""
      raise FileNotFoundError(f"{path} holds no {WEIGHTS} (nor {WEIGHTS_INDEX}){hint}")
    config_path = config or paths.join(path, CONFIG)
  elif paths.isfile(path):
    files = [path]
    config_path = config or paths.join(paths.dirname(path), CONFIG)
  else:
    raise FileNotFoundError(
      f"no checkpoint at {path}: give a directory holding {CONFIG} and "
      f"{WEIGHTS}, or a .safetensors file"
    )
  if not need_config:
    return files, None
  config_path = paths.resolve(config_path, what="config")
  if paths.isdir(config_path):
    config_path = paths.join(config_path, CONFIG)
  if not paths.isfile(config_path):
    raise FileNotFoundError(
      f"no config for {path}: {config_path} does not exist (pass the config.json path as config=)"
    )
  return files, config_path


def read_index(index: str) -> dict:
  """{tensor name: shard path} of a sharded checkpoint's index file (transformers'
  model.safetensors.index.json: {"weight_map": {name: shard file name}, ...}), every shard
  inside the index's directory.

  Raises:
    ValueError: not JSON, not of that form, or a shard named outside the directory (naming
      the index file and the entry).
  """
  try:
    parsed = json.loads(paths.read_text(index))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{index} is not valid JSON: {e}") from None
  weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
  if not isinstance(weight_map, dict) or not all(isinstance(k, str) for k in weight_map):
    raise ValueError(
      f'{index} must hold a JSON object whose "weight_map" maps each tensor '
      f"name to its shard file, got "
      f"{type(parsed if not isinstance(parsed, dict) else weight_map).__name__}"
    )
  directory = paths.dirname(index)
  return {
    name: paths.inside(directory, shard, what=f"{index}: weight_map[{name!r}]")
    for name, shard in weight_map.items()
  }


# safetensors' element types, by the size of one element in bytes
DTYPE_BYTES = {
  "BOOL": 1,
  "U8": 1,
  "I8": 1,
  "F8_E4M3": 1,
  "F8_E5M2": 1,
  "U16": 2,
  "I16": 2,
  "F16": 2,
  "BF16": 2,
  "U32": 4,
  "I32": 4,
  "F32": 4,
  "U64": 8,
  "I64": 8,
  "F64": 8,
}
NUMPY_NAMES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


def read_header(path: str) -> dict:
  """{tensor name: (safetensors dtype, shape)} of a safetensors file, from its header alone
  (its first bytes: nothing else is read), checked as the safetensors library checks it before
  it maps any data: a header length that fits the file, known dtypes, shapes of sizes, and
  data_offsets that, in order, tile the data region exactly, each span the size its shape and
  dtype need.

  Raises:
    ValueError: one line naming the file and what is wrong.
  """

  def bad(why: str) -> ValueError:
    return ValueError(f"{path} is not a valid safetensors file: {why}")

  size = paths.size(path)
  with paths.open_read(path) as f:
    head = f.read(8)
    if len(head) < 8:
      raise bad(f"it has {size} bytes, fewer than the 8 of its header length")
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER_BYTES or 8 + n > size:
      raise bad(f"its header length {n} does not fit a file of {size} bytes")
    raw = f.read(n)
  try:
    header = json.loads(raw)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise bad(f"its header is not JSON ({e})") from None
  if not isinstance(header, dict):
    raise bad(f"its header is a JSON {type(header).__name__}, not an object")
  meta = header.pop("__metadata__", {})
  if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
    raise bad("its __metadata__ is not an object of strings")
  out, spans = {}, []
  for name, entry in header.items():
    entry = entry if isinstance(entry, dict) else {}
    dtype, shape, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
      raise bad(f"tensor {name!r} has dtype {dtype!r}, not one of {', '.join(DTYPE_BYTES)}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
      raise bad(f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not (
      isinstance(span, list)
      and len(span) == 2
      and all(type(o) is int for o in span)
      and 0 <= span[0] <= span[1]
    ):
      raise bad(
        f"tensor {name!r} has data_offsets {span!r}, not [begin, end] with 0 <= begin <= end"
      )
    need = math.prod(shape) * DTYPE_BYTES[dtype]
    if span[1] - span[0] != need:
      raise bad(
        f"tensor {name!r} spans {span[1] - span[0]} bytes, but shape {tuple(shape)} of "
        f"{dtype} needs {need}"
      )
    spans.append((span[0], span[1], name))
    out[name] = (dtype, tuple(shape))
  end, after = 0, "the start of the data"
  for begin, stop, name in sorted(spans):
    if begin != end:
      raise bad(
        f"tensor {name!r} begins at byte {begin} of the data, but {after} ends at {end} "
        f"({'overlapping' if begin < end else 'a gap'})"
      )
    end, after = stop, f"tensor {name!r}"
  if end != size - 8 - n:
    raise bad(f"its tensors end at byte {end} of a data region of {size - 8 - n} bytes")
  return out


def read_headers(files) -> dict:
  """{tensor name: (safetensors dtype, shape)} of one or more safetensors files (`read_header`
  of each; shards must not repeat a name)."""
  out: dict = {}
  for f in files:
    for name, described in read_header(f).items():
      if name in out:
        raise ValueError(f"tensor {name} appears in two shards (second: {f})")
      out[name] = described
  return out


def read_tensors(files) -> dict:
  """{name: numpy array} of one or more safetensors files (shards must not repeat a name),
  each header checked first (`read_header`). A local file is read by safetensors itself; a
  gs:// one is fetched whole into memory and parsed from there (the bytes and the arrays:
  twice the file's size at the peak).

  Raises:
    ValueError: a file that is not valid safetensors, naming it.
  """
  st = _safetensors_numpy()
  read_headers(files)
  out: dict = {}
  for f in files:
    try:
      loaded = st.load(paths.read_bytes(f)) if paths.is_remote(f) else st.load_file(f)
    except Exception as e:  # noqa: BLE001 - safetensors' own error type is not exported
      if isinstance(e, (OSError, MemoryError)) or paths.is_storage_error(e):
        raise
      raise ValueError(f"{f} cannot be read as safetensors: {e}") from None
    for name, array in loaded.items():
      out[name] = array
  return out


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _as_os_error(e: Exception, path: str) -> Exception:
  """safetensors reports a failed write (a full disk, a vanished directory) as its own
  SafetensorError whose message ends "(os error N)"; that becomes OSError(N) on `path`, so
  callers sort it as I/O. Any other error is returned as it is."""
  found = re.search(r"\(os error (\d+)\)", str(e))
  if isinstance(e, OSError) or found is None:
    return e
  code = int(found.group(1))
  return OSError(code, os.strerror(code), path)


def _replace_atomically(path: str, write) -> None:
  """Local files: write(tmp), then renames tmp to path; the file gets the mode an ordinary new
  file gets (safetensors itself creates files readable by their owner only).

  Raises:
    OSError: the write or the rename failed (safetensors' own I/O errors included).
  """
  name = f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}"
  tmp = os.path.join(os.path.dirname(path), name)
  try:
    try:
      write(tmp)
    except Exception as e:  # noqa: BLE001 - safetensors' error type is not exported
      raised = _as_os_error(e, tmp)
      if raised is e:
        raise
      raise raised from None
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_checkpoint(
  out_dir: str, tensors: Mapping[str, np.ndarray], config: dict, *, metadata: Optional[dict] = None
) -> dict:
  """Writes out_dir/model.safetensors (the tensors, contiguous) and out_dir/config.json;
  returns {"config": path, "weights": path}. The weights are written first, so a directory
  whose config.json exists holds its complete weights.

  out_dir is local or gs://. Each file replaces its predecessor whole: locally safetensors
  writes a temporary file that is renamed; on gs:// the file is serialised in memory and
  uploaded as one object, which GCS publishes whole or not at all.

  Raises:
    OSError: the directory cannot be created or written (disk full, permissions, storage).
    paths.MissingExtra: a gs:// out_dir without gcsfs installed.
  """
  st = _safetensors_numpy()
  out_dir = paths.resolve(out_dir, what="export directory")
  paths.makedirs(out_dir)
  weights, config_path = paths.join(out_dir, WEIGHTS), paths.join(out_dir, CONFIG)
  arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
  if paths.is_remote(weights):
    paths.write_atomic(weights, st.save(arrays, metadata=metadata))
  else:  # straight from the arrays to the file, without a serialised copy in memory
    _replace_atomically(weights, lambda p: st.save_file(arrays, p, metadata=metadata))
  paths.write_atomic(config_path, json.dumps(config, indent=2) + "\n")
  return {"config": config_path, "weights": weights}
