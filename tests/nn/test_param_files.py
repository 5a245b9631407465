"""param_files.py and pretrained.check_files: what comes from outside (safetensors files, index
files, names inside a model directory) is checked before it is used, each problem one line
naming the file."""

import json
import pathlib
import shutil

import numpy as np
import pytest
from flax import nnx

from rove_jax.nn import param_files, pretrained
from rove_jax.nn.model import GPT
from rove_jax.nn.model_config import GPTConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests" / "reference_data" / "llama_family" / "llama_gqa"


def safetensors_bytes(header: dict, data: bytes, *, length=None) -> bytes:
  """A safetensors file: 8 bytes of header length (little-endian), the JSON header, the data."""
  raw = json.dumps(header).encode()
  return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


def two_tensors(**changes) -> dict:
  """The header of a: F32 [2, 3] (24 bytes) and b: F32 [4] (16 bytes), with `changes` applied
  to b's entry."""
  return {
    "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40], **changes},
  }


DAMAGED = {  # file name: (its bytes, what the message says)
  "huge_header.safetensors": (
    safetensors_bytes(two_tensors(), bytes(40), length=2**60),
    "header length 1152921504606846976 does not fit a file",
  ),
  "overlap.safetensors": (
    safetensors_bytes(two_tensors(data_offsets=[16, 32]), bytes(40)),
    "tensor 'b' begins at byte 16 of the data, but tensor 'a' ends at 24 (overlapping)",
  ),
  "shape_lie.safetensors": (
    safetensors_bytes(two_tensors(shape=[4, 4]), bytes(40)),
    "tensor 'b' spans 16 bytes, but shape (4, 4) of F32 needs 64",
  ),
  "dtype_lie.safetensors": (
    safetensors_bytes(two_tensors(dtype="F64"), bytes(40)),
    "tensor 'b' spans 16 bytes, but shape (4,) of F64 needs 32",
  ),
  "unknown_dtype.safetensors": (
    safetensors_bytes(two_tensors(dtype="F128"), bytes(40)),
    "tensor 'b' has dtype 'F128', not one of",
  ),
  "truncated.safetensors": (
    safetensors_bytes(two_tensors(), bytes(30)),
    "its tensors end at byte 40 of a data region of 30 bytes",
  ),
  "gap.safetensors": (
    safetensors_bytes(two_tensors(data_offsets=[28, 44]), bytes(44)),
    "tensor 'b' begins at byte 28 of the data, but tensor 'a' ends at 24 (a gap)",
  ),
  "not_json.safetensors": (b"\x05\0\0\0\0\0\0\0{abc}", "its header is not JSON"),
  "list_header.safetensors": (
    safetensors_bytes([1, 2], b""),  # type: ignore[arg-type]
    "its header is a JSON list, not an object",
  ),
  "short.safetensors": (b"\x01\0", "it has 2 bytes, fewer than the 8 of its header length"),
}


def test_a_valid_file_reads_back_its_header_and_tensors(tmp_path):
  path = tmp_path / "ok.safetensors"
  data = np.arange(6, dtype=np.float32).tobytes() + np.arange(4, dtype=np.float32).tobytes()
  path.write_bytes(safetensors_bytes({"__metadata__": {"format": "pt"}, **two_tensors()}, data))
  assert param_files.read_header(str(path)) == {"a": ("F32", (2, 3)), "b": ("F32", (4,))}
  got = param_files.read_tensors([str(path)])
  np.testing.assert_array_equal(got["a"], np.arange(6, dtype=np.float32).reshape(2, 3))
  np.testing.assert_array_equal(got["b"], np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_safetensors_file_is_one_line_naming_it(tmp_path, name):
  contents, says = DAMAGED[name]
  path = tmp_path / name
  path.write_bytes(contents)
  for read in (param_files.read_header, lambda p: param_files.read_tensors([p])):
    with pytest.raises(ValueError) as e:
      read(str(path))
    message = str(e.value)
    assert message.startswith(f"{path} is not a valid safetensors file: ") and says in message
    assert "\n" not in message


def llama_copy(tmp_path, name="model") -> pathlib.Path:
  out = tmp_path / name
  out.mkdir()
  for f in ("config.json", "model.safetensors"):
    shutil.copy(LLAMA / f, out / f)
  return out


def shard(directory: pathlib.Path, index: dict) -> None:
  """Turns directory's model.safetensors into a sharded checkpoint with `index` as its index."""
  (directory / "model.safetensors").rename(directory / "model-00001-of-00001.safetensors")
  (directory / param_files.WEIGHTS_INDEX).write_text(json.dumps(index))


@pytest.mark.parametrize(
  "index,says",
  [
    ([1, 2], 'must hold a JSON object whose "weight_map"'),
    ({"weight_map": ["model-00001-of-00001.safetensors"]}, "must hold a JSON object"),
    (
      {"weight_map": {"lm_head.weight": "../elsewhere.safetensors"}},
      "weight_map['lm_head.weight'] '../elsewhere.safetensors' leads outside it",
    ),
    (
      {"weight_map": {"lm_head.weight": "/tmp/elsewhere.safetensors"}},
      "weight_map['lm_head.weight'] '/tmp/elsewhere.safetensors' is an absolute path",
    ),
    ({"weight_map": {"lm_head.weight": "gs://b/elsewhere.safetensors"}}, "is an absolute path"),
  ],
)
def test_an_index_that_is_not_a_weight_map_inside_its_directory_is_refused(tmp_path, index, says):
  model = llama_copy(tmp_path)
  shard(model, index)
  # the file it points at exists: it must be refused for where it is, not for being absent
  shutil.copy(LLAMA / "model.safetensors", tmp_path / "elsewhere.safetensors")
  for read in (param_files.locate, pretrained.load, pretrained.check_files):
    with pytest.raises(ValueError) as e:
      read(str(model))
    assert str(model / param_files.WEIGHTS_INDEX) in str(e.value) and says in str(e.value)


def test_a_sharded_checkpoint_inside_its_directory_loads(tmp_path):
  model = llama_copy(tmp_path)
  names = param_files.read_header(str(model / "model.safetensors"))
  shard(model, {"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}})
  config, _ = pretrained.check_files(str(model))
  _, params = pretrained.load(str(model))
  _, want = pretrained.load(str(LLAMA))
  for k, v in param_files.named(want).items():
    np.testing.assert_array_equal(param_files.named(params)[k], v)
  assert config.n_layer == 2


def test_tensors_that_are_not_the_configs_model_are_refused_from_the_headers(tmp_path):
  """A file that is valid safetensors but not the model its config.json describes: refused
  before any tensor is read, naming the tensor."""
  model = llama_copy(tmp_path)
  hf = json.loads((model / "config.json").read_text())
  (model / "config.json").write_text(json.dumps({**hf, "intermediate_size": 64}))
  with pytest.raises(
    ValueError,
    match=r"model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight has "
    r"shape \(\d+, \d+\); its config\.json says",
  ):
    pretrained.check_files(str(model))
  (model / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": 3}))
  with pytest.raises(ValueError, match=r"missing \['model\.layers\.2\."):
    pretrained.check_files(str(model))


def test_a_rove_jax_export_whose_dtype_is_not_its_param_dtype_is_refused(tmp_path):
  config = GPTConfig.tiny(vocab_size=64, n_layer=1, n_head=2, d_model=16, max_len=16)
  params = nnx.state(GPT(config, rngs=nnx.Rngs(0)), nnx.Param)
  pretrained.save(str(tmp_path / "export"), config, params, format="rove_jax")
  assert pretrained.check_files(str(tmp_path / "export"))[0] == config
  hf = json.loads((tmp_path / "export" / "config.json").read_text())
  hf["dtype"], hf["rove_jax"]["param_dtype"] = "bfloat16", "bfloat16"
  (tmp_path / "export" / "config.json").write_text(json.dumps(hf))
  with pytest.raises(
    ValueError,
    match=r"model\.safetensors: \S+ is F32, its config\.json's "
    r"param_dtype is bfloat16",
  ):
    pretrained.check_files(str(tmp_path / "export"))
