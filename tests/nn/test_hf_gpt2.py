"""GPT-2 interop and exports: rove_jax.nn.hf_gpt2, rove_jax.nn.pretrained, rove_jax.train.export.

The reference is tests/reference_data/gpt2_tiny/: a tiny GPT2LMHeadModel saved by transformers with
every
parameter (biases and LayerNorm gains included) redrawn at random, and transformers' logits of
two token rows, written by scripts/gpt2_reference.py (its versions in reference.json).
Covered: that checkpoint loads into the GPT and reproduces transformers' logits to float32
rounding; names with and without the "transformer." prefix, mask buffers, a stored tied
lm_head, a bare .safetensors file and a sharded checkpoint read the same; the GPT-2 export of
that model writes transformers' own tensors back bit for bit; exports in both formats load
back to the same config and bitwise-equal parameters (tied and untied, bfloat16, RoVE with
YaRN and GQA, RMSNorm/SwiGLU/no-bias/T5) and the same logits; the rove-jax config.json gives
`rope_from_hf_config` the model's own rotary frequencies; a training workdir exports its newest
verified checkpoint (a corrupted newer one is skipped); and every bad input is a clear error.

When torch and transformers are installed, `test_transformers_loads_the_gpt2_export` also
loads the exports with GPT2LMHeadModel; without them it is skipped, and the same check runs
across two environments:
    python -m tests.nn.test_hf_gpt2 /tmp/exports                      # this project's venv
    /tmp/hfref/bin/python scripts/gpt2_reference.py --check /tmp/exports
"""

import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from rove_jax import hf_rope
from rove_jax.cli import export as export_cli
from rove_jax.nn import hf_gpt2, param_files, pretrained
from rove_jax.nn.model import abstract_params, generate
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import checkpoint as ckpt_lib

DATA = pathlib.Path(__file__).parents[1] / "reference_data" / "gpt2_tiny"
RTOL = 1e-5  # of the logits' scale: float32 rounding of two implementations


def reference():
  tokens = np.asarray(json.loads((DATA / "reference.json").read_text())["tokens"], np.int32)
  return tokens, np.load(DATA / "logits.npy")


def logits_of(config, params, tokens):
  """The GPT's logits, jitted (one compile, much faster than the op-by-op first call)."""
  graphdef, state = nnx.split(pretrained.build(config, params))
  forward = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
  return np.asarray(forward(state, jnp.asarray(tokens)))


def assert_logits_close(got, want):
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())


def assert_same_params(a, b):
  na, nb = param_files.named(a), param_files.named(b)
  assert sorted(na) == sorted(nb)
  for name in na:
    assert na[name].dtype == nb[name].dtype, name
    np.testing.assert_array_equal(na[name], nb[name], err_msg=name)


def random_params(config, seed=0):
  """Every parameter drawn at random (biases and norm gains too), in the config's dtype."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda leaf: jnp.asarray(rng.normal(0.0, 0.3, leaf.shape), leaf.dtype), abstract_params(config)
  )


def learned(**overrides):
  return GPTConfig(
    **{
      **dict(
        vocab_size=48, n_layer=2, n_head=2, d_model=16, d_ff=40, max_len=16, pos_encoding="learned"
      ),
      **overrides,
    }
  )


# ------------------------------------------------------------------- transformers' checkpoint


def test_transformers_gpt2_checkpoint_reproduces_its_logits():
  config, params = hf_gpt2.load_gpt2(DATA)
  assert (config.pos_encoding, config.norm, config.mlp, config.use_bias) == (
    "learned",
    "layernorm",
    "gelu",
    True,
  )
  assert (
    config.vocab_size,
    config.n_layer,
    config.n_head,
    config.d_model,
    config.d_ff,
    config.max_len,
    config.tie_embeddings,
    config.norm_eps,
  ) == (64, 2, 2, 16, 64, 16, True, 1e-5)
  tokens, want = reference()
  assert_logits_close(logits_of(config, params, tokens), want)


def test_prefix_buffers_tied_head_file_path_and_shards_read_the_same(tmp_path):
  _, want = hf_gpt2.load_gpt2(DATA)
  tensors = load_file(DATA / "model.safetensors")
  bare = {k[len("transformer.") :]: v for k, v in tensors.items()}
  bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))  # old mask buffers
  bare["h.1.attn.masked_bias"] = np.asarray(-1e4, np.float32)
  bare["lm_head.weight"] = bare["wte.weight"].copy()  # a tied head stored anyway
  save_file(bare, tmp_path / "weights.safetensors")
  config = json.loads((DATA / "config.json").read_text())
  for cfg_arg in (config, str(DATA / "config.json"), str(DATA)):
    got_cfg, got = hf_gpt2.load_gpt2(tmp_path / "weights.safetensors", cfg_arg)
    assert_same_params(got, want)
  # transformers' sharded form: an index naming two files
  shard = tmp_path / "sharded"
  shard.mkdir()
  names = sorted(tensors)
  halves = {
    "model-00001-of-00002.safetensors": names[::2],
    "model-00002-of-00002.safetensors": names[1::2],
  }
  for file, keys in halves.items():
    save_file({k: tensors[k] for k in keys}, shard / file)
  (shard / "model.safetensors.index.json").write_text(
    json.dumps({"weight_map": {k: f for f, keys in halves.items() for k in keys}})
  )
  (shard / "config.json").write_text(json.dumps(config))
  assert_same_params(pretrained.load(shard)[1], want)


def test_gpt2_export_writes_transformers_own_tensors_and_loads_back(tmp_path):
  config, params = hf_gpt2.load_gpt2(DATA)
  written = pretrained.save(tmp_path, config, params)
  assert written["format"] == "gpt2"
  ours, theirs = load_file(written["weights"]), load_file(DATA / "model.safetensors")
  assert sorted(ours) == sorted(theirs)
  for name in theirs:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
  hf, ref = (
    json.loads(pathlib.Path(p).read_text()) for p in (written["config"], DATA / "config.json")
  )
  for key in (
    "model_type",
    "vocab_size",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "layer_norm_epsilon",
    "tie_word_embeddings",
    "scale_attn_weights",
  ):
    assert hf[key] == ref[key], key
  assert hf["n_inner"] in (None, 4 * ref["n_embd"]) and hf["activation_function"] == "gelu_new"
  config2, params2 = pretrained.load(tmp_path)
  assert config2 == config
  assert_same_params(params2, params)


# ------------------------------------------------------------------------------- round trips


def test_untied_bfloat16_learned_gpt_round_trips_in_gpt2_format(tmp_path):
  config = learned(
    tie_embeddings=False, param_dtype="bfloat16", norm_eps=1e-6, attention_impl="chunked"
  )
  params = random_params(config)
  written = pretrained.save(tmp_path, config, params)
  assert written["format"] == "gpt2"
  tensors = load_file(written["weights"])
  head = np.asarray(params["lm_head"][...])
  np.testing.assert_array_equal(tensors["lm_head.weight"], head.T)  # torch Linear: [out, in]
  assert tensors["lm_head.weight"].dtype == head.dtype  # bfloat16 stays bfloat16
  hf = json.loads(pathlib.Path(written["config"]).read_text())
  assert (hf["n_inner"], hf["layer_norm_epsilon"], hf["tie_word_embeddings"], hf["dtype"]) == (
    40,
    1e-6,
    False,
    "bfloat16",
  )
  config2, params2 = pretrained.load(tmp_path)
  assert config2 == config  # dtype, kernel and the rest come back from the rove_jax section
  assert_same_params(params2, params)  # the same config and parameters: the same model
  # the mode of any new file (safetensors alone would make it readable by its owner only)
  umask = os.umask(0o022)
  os.umask(umask)
  assert os.stat(written["weights"]).st_mode & 0o777 == 0o666 & ~umask


def test_rove_export_round_trips_and_describes_its_rotary_setup(tmp_path):
  config = GPTConfig(
    vocab_size=40,
    n_layer=2,
    n_head=4,
    n_kv_head=2,
    d_model=32,
    d_ff=48,
    max_len=32,
    pos_encoding="rove",
    rove_layers=(1,),
    rope_layout="half",
    rotary_fraction=0.5,
    rope_base=500.0,
    rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
  )
  params = random_params(config, seed=1)
  written = pretrained.save(tmp_path, config, params)
  assert written["format"] == "rove_jax"
  hf = json.loads(pathlib.Path(written["config"]).read_text())
  assert (
    hf["model_type"],
    hf["position_embedding_type"],
    hf["rove"],
    hf["rove_layers"],
    hf["rope_layout"],
    hf["num_key_value_heads"],
  ) == ("rove_jax_gpt", "rove", True, [1], "half", 2)
  # a tool that reads transformers' rope keys gets the model's own frequencies
  model = pretrained.build(config, params)
  inv_freq, factor = model.rotary_frequencies(config.max_len)
  rope = hf_rope.rope_from_hf_config(tmp_path)
  assert rope.rot_dim == config.rot_dim == 4
  np.testing.assert_allclose(rope.inv_freq, inv_freq, rtol=1e-6)
  assert rope.attention_factor == pytest.approx(float(factor), rel=1e-6)
  config2, params2 = pretrained.load(tmp_path)
  assert config2 == config
  assert_same_params(params2, params)
  prompt = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int32)
  full = logits_of(config2, params2, prompt)
  np.testing.assert_array_equal(full, logits_of(config, params, prompt))
  # ready for generate: greedy decoding through the KV cache picks the forward pass's argmax
  out = np.asarray(generate(pretrained.build(config2, params2), prompt, 1, temperature=0.0))
  assert out[0, -1] == full[0, -1].argmax()


@pytest.mark.parametrize(
  "overrides",
  [
    dict(
      norm="rmsnorm",
      mlp="swiglu",
      use_bias=False,
      tie_embeddings=False,
      pos_encoding="rope",
      rope_layout="interleaved",
    ),
    dict(pos_encoding="t5_bias", t5_num_buckets=8, t5_max_distance=20, param_dtype="float16"),
    dict(pos_encoding="learned", use_bias=False),  # not GPT-2 (no biases): rove-jax's format
  ],
)
def test_other_models_round_trip_in_rove_jax_format(tmp_path, overrides):
  config = GPTConfig(
    **{**dict(vocab_size=40, n_layer=1, n_head=2, d_model=16, d_ff=24, max_len=16), **overrides}
  )
  params = random_params(config, seed=2)
  assert pretrained.save(tmp_path, config, params)["format"] == "rove_jax"
  hf = json.loads((tmp_path / "config.json").read_text())
  for config_arg in (None, hf):  # a file path, with the config beside it or given
    config2, params2 = pretrained.load(tmp_path / "model.safetensors", config_arg)
    assert config2 == config
    assert_same_params(params2, params)


# ------------------------------------------------------------------------- a training run


def write_run(workdir, config, steps_params, tokenizer):
  ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), async_save=False)
  for step, params in steps_params:
    state = {ckpt_lib.PARAMS + k: v for k, v in ckpt_lib.to_flat(params).items()}
    state["step"] = jnp.asarray(step, jnp.int32)
    ck.save(step, state, {}, {"model": config.to_dict(), "config": {}, "tokenizer": tokenizer})
  ck.close()


def test_export_of_a_workdir_takes_its_newest_verified_checkpoint(tmp_path, capsys):
  config = learned()
  old, new = random_params(config, 3), random_params(config, 4)
  tokenizer = {
    "spec": "bytes",
    "name": "bytes",
    "vocab_size": 257,
    "eot_id": 47,
    "fingerprint": "bytes-v1",
  }
  workdir = tmp_path / "run"
  write_run(workdir, config, [(2, old), (4, new)], tokenizer)
  # step 4's metadata edited after saving: it fails its checksum and step 2 is exported
  meta_file = next((workdir / "checkpoints" / "4" / "meta").rglob("metadata"))
  meta_file.write_text(meta_file.read_text().replace('"eot_id": 47', '"eot_id": 46'))
  out = tmp_path / "export"
  assert export_cli.main(["--workdir", str(workdir), "--out", str(out)]) == 0
  captured = capsys.readouterr()
  assert "step 4" in captured.err and "exported step 2" in captured.out
  config2, params2 = pretrained.load(out)
  assert config2 == config
  assert_same_params(params2, old)
  hf = json.loads((out / "config.json").read_text())
  assert hf["model_type"] == "gpt2" and hf["eos_token_id"] == hf["bos_token_id"] == 47
  assert hf["rove_jax_run"] == {"step": 2, "workdir": "run", "tokenizer": tokenizer}
  # an existing export is not overwritten unless asked
  assert export_cli.main(["--workdir", str(workdir), "--out", str(out)]) == 2
  assert "--overwrite" in capsys.readouterr().err
  assert (
    export_cli.main(
      ["--workdir", str(workdir), "--out", str(out), "--overwrite", "--format", "rove_jax"]
    )
    == 0
  )
  assert pretrained.load(out)[0] == config
  assert json.loads((out / "config.json").read_text())["model_type"] == "rove_jax_gpt"
  assert export_cli.main(["--workdir", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
  assert "does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------------------- bad input


def gpt2_dir(tmp_path, *, config_edit=None, tensors_edit=None):
  """A copy of the reference checkpoint with its config and tensors edited."""
  d = tmp_path / "ckpt"
  d.mkdir()
  config = json.loads((DATA / "config.json").read_text())
  tensors = load_file(DATA / "model.safetensors")
  if config_edit:
    config_edit(config)
  if tensors_edit:
    tensors_edit(tensors)
  (d / "config.json").write_text(json.dumps(config))
  save_file(tensors, d / "model.safetensors")
  return d


def _drop(name):
  return lambda t: t.pop(name)


def _set(key, value):
  return lambda c: c.__setitem__(key, value)


@pytest.mark.parametrize(
  "config_edit, tensors_edit, match",
  [
    (_set("model_type", "llama"), None, "model_type 'llama'"),
    (_set("activation_function", "gelu"), None, "activation_function='gelu'"),
    (_set("scale_attn_by_inverse_layer_idx", True), None, "scale_attn_by_inverse_layer_idx"),
    (None, _drop("transformer.ln_f.bias"), r"missing \['ln_f.bias'\]"),
    (
      None,
      lambda t: t.__setitem__("transformer.h.0.attn.q_proj.weight", np.zeros(2, np.float32)),
      r"unexpected \['h.0.attn.q_proj.weight'\]",
    ),
    (
      _set("n_positions", 20),
      None,
      r"wpe.weight has shape \(16, 16\); its config.json says "
      r"\(20, 16\)",
    ),
    (_set("n_layer", 3), None, r"missing \['h.2."),
    (
      None,
      lambda t: t.__setitem__("lm_head.weight", t["transformer.wte.weight"] + 1),
      "tie_word_embeddings",
    ),
    (
      _set("rove_jax", learned(vocab_size=64, d_ff=64, n_layer=1).to_dict()),
      None,
      r"describe different models: n_layer \(1 vs 2\)",
    ),
  ],
)
def test_bad_gpt2_checkpoints_are_clear_errors(tmp_path, config_edit, tensors_edit, match):
  d = gpt2_dir(tmp_path, config_edit=config_edit, tensors_edit=tensors_edit)
  with pytest.raises(ValueError, match=match):
    hf_gpt2.load_gpt2(d)


def test_missing_files_are_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint at"):
    pretrained.load(tmp_path / "nope")
  (tmp_path / "torch").mkdir()
  (tmp_path / "torch" / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(FileNotFoundError, match="torch pickle"):
    hf_gpt2.load_gpt2(tmp_path / "torch")
  (tmp_path / "bare").mkdir()
  save_file({"x": np.zeros(1, np.float32)}, tmp_path / "bare" / "model.safetensors")
  with pytest.raises(FileNotFoundError, match="no config"):
    pretrained.load(tmp_path / "bare")
  (tmp_path / "bare" / "config.json").write_text('{"model_type": "gemma"}')
  with pytest.raises(ValueError, match=r"rove-jax loads transformers' \('gpt2', 'llama'"):
    pretrained.load(tmp_path / "bare")


def test_exports_refuse_what_they_cannot_hold(tmp_path):
  rove = GPTConfig(vocab_size=40, n_layer=1, n_head=2, d_model=16, max_len=16)
  with pytest.raises(ValueError, match="pos_encoding='rove'"):
    pretrained.save(tmp_path / "a", rove, random_params(rove), format="gpt2")
  with pytest.raises(ValueError, match="unknown export format"):
    pretrained.save(tmp_path / "a", rove, random_params(rove), format="onnx")
  with pytest.raises(ValueError, match="missing"):  # parameters of another model
    pretrained.save(tmp_path / "a", learned(), random_params(rove))
  assert not (tmp_path / "a").exists()  # nothing written
  pretrained.save(tmp_path / "b", rove, random_params(rove))
  hf = json.loads((tmp_path / "b" / "config.json").read_text())
  hf["hidden_size"] = 32  # edited by hand: no longer what the rove_jax section builds
  (tmp_path / "b" / "config.json").write_text(json.dumps(hf))
  with pytest.raises(ValueError, match=r"\['hidden_size'\] disagree"):
    pretrained.load(tmp_path / "b")


def test_without_safetensors_the_error_names_the_pip_command(monkeypatch):
  monkeypatch.setitem(sys.modules, "safetensors", None)
  monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
  with pytest.raises(ModuleNotFoundError, match=r"pip install 'rove_jax\[interop\]'"):
    hf_gpt2.load_gpt2(DATA)


# ------------------------------------------------------------------------------ transformers


def write_exports(root) -> list:
  """GPT-2 exports of two random GPTs (tied; untied with n_inner and another eps) under root,
  each with expected.npz (tokens, rove-jax's logits): what transformers must reproduce."""
  root = pathlib.Path(root)
  tokens = (np.arange(2 * 16, dtype=np.int32).reshape(2, 16) * 7) % 48
  out = []
  for name, config in (
    ("tied", learned()),
    ("untied", learned(tie_embeddings=False, d_ff=24, norm_eps=1e-6)),
  ):
    params = random_params(config, seed=len(out))
    pretrained.save(root / name, config, params, format="gpt2")
    np.savez(root / name / "expected.npz", tokens=tokens, logits=logits_of(config, params, tokens))
    out.append(root / name)
  return out


def test_transformers_loads_the_gpt2_export(tmp_path):
  torch = pytest.importorskip("torch", reason="torch is not installed (reference-only tool)")
  transformers = pytest.importorskip("transformers", reason="transformers is not installed")
  for path in write_exports(tmp_path):
    expected = np.load(path / "expected.npz")
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
      got = model(torch.as_tensor(expected["tokens"])).logits.float().numpy()
    assert_logits_close(got, expected["logits"])


if __name__ == "__main__":
  for p in write_exports(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rove_jax_gpt2_exports"):
    print(p)
