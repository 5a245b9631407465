"""Llama-family interop: rove_jax.nn.hf_llama and its dispatch in rove_jax.nn.pretrained, and
the two GPTConfig settings the mapping needs (qkv_bias, sliding_window).

The reference is tests/reference_data/llama_family/: one tiny random checkpoint per case, saved
by transformers with every parameter redrawn (norm gains and biases included), and transformers'
float32 logits of two rows of 24 tokens, written by scripts/llama_reference.py (versions in each
reference.json): llama with GQA and an untied head; llama with a tied head, biases on q, k, v
and o, and Llama 3 rope scaling; llama with YaRN; qwen2 (q/k/v biases, tied); mistral with a
sliding window of 5 and one kv head, in transformers' shards.
Covered: each loads through `pretrained.load` into the GPT and reproduces transformers' logits
to float32 rounding (and the reference tells the scaling and the window apart: dropping either
moves the logits far past the tolerance); the export of each writes transformers' own tensors
back bit for bit, a config.json with the same architecture keys, and loads back to the same
config and parameters; "auto" picks the type that fits; settings the GPT cannot compute are
refused naming their keys.

That transformers loads the exports with equal logits is checked across two environments
(tests/reference_data/llama_family/README.md records the run):
    python -m tests.nn.test_hf_llama /tmp/llama_exports                 # this project's venv
    /tmp/hfref/bin/python scripts/llama_reference.py --check /tmp/llama_exports
"""

import dataclasses
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from rove_jax.nn import hf_llama, param_files, pretrained
from rove_jax.nn.model_config import GPTConfig
from tests.nn.test_hf_gpt2 import assert_same_params, random_params

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "reference_data" / "llama_family"
RTOL = 1e-5  # of the logits' scale: float32 rounding of two implementations
CASES = {  # case: (model_type, GPTConfig fields the checkpoint must give)
  "llama_gqa": (
    "llama",
    dict(
      n_head=4,
      n_kv_head=2,
      tie_embeddings=False,
      use_bias=False,
      qkv_bias=False,
      rope_base=500.0,
      rope_scaling=None,
      sliding_window=0,
    ),
  ),
  "llama_llama3_tied": (
    "llama",
    dict(n_kv_head=4, tie_embeddings=True, use_bias=True, rope_base=100.0, sliding_window=0),
  ),
  "llama_yarn": ("llama", dict(n_kv_head=2, tie_embeddings=False, rope_base=100.0)),
  "qwen2": (
    "qwen2",
    dict(
      n_kv_head=2,
      tie_embeddings=True,
      use_bias=False,
      qkv_bias=True,
      rope_base=10000.0,
      rope_scaling=None,
      sliding_window=0,
    ),
  ),
  "mistral_sharded": (
    "mistral",
    dict(
      n_kv_head=1,
      tie_embeddings=False,
      use_bias=False,
      qkv_bias=False,
      sliding_window=5,
      rope_base=1000.0,
    ),
  ),
}


def reference(case):
  d = DATA / case
  tokens = np.asarray(json.loads((d / "reference.json").read_text())["tokens"], np.int32)
  return tokens, np.load(d / "logits.npy")


def logits_of(config, params, tokens):
  """The GPT's logits, jitted (one compile, much faster than the op-by-op first call)."""
  graphdef, state = nnx.split(pretrained.build(config, params))
  forward = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
  return np.asarray(forward(state, jnp.asarray(tokens)))


def relative_error(got, want):
  return float(np.abs(got - want).max() / np.abs(want).max())


def checkpoint_tensors(case):
  files = sorted((DATA / case).glob("*.safetensors"))
  return {k: v for f in files for k, v in load_file(f).items()}


def llama_shaped(**overrides):
  return GPTConfig(
    **{
      **dict(
        vocab_size=40,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        d_model=32,
        d_ff=48,
        max_len=32,
        pos_encoding="rope",
        rope_layout="half",
        norm="rmsnorm",
        mlp="swiglu",
        use_bias=False,
        tie_embeddings=False,
        norm_eps=1e-6,
      ),
      **overrides,
    }
  )


# ------------------------------------------------------------------ transformers' checkpoints


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_reproduces_transformers_logits(case):
  model_type, fields = CASES[case]
  config, params = pretrained.load(DATA / case)
  assert (
    config.vocab_size,
    config.n_layer,
    config.n_head,
    config.d_model,
    config.d_ff,
    config.max_len,
    config.norm_eps,
    config.param_dtype,
  ) == (64, 2, 4, 32, 48, 64, 1e-6, "float32")
  assert (config.pos_encoding, config.rope_layout, config.norm, config.mlp) == (
    "rope",
    "half",
    "rmsnorm",
    "swiglu",
  )
  for name, value in fields.items():
    assert getattr(config, name) == value, name
  tokens, want = reference(case)
  assert relative_error(logits_of(config, params, tokens), want) <= RTOL


def test_rope_scaling_and_window_are_read_from_the_checkpoint():
  llama3, _ = pretrained.load(DATA / "llama_llama3_tied")
  assert llama3.rope_scaling.to_dict() == dict(
    rope_type="llama3",
    factor=4.0,
    original_max_position_embeddings=16,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
  )
  yarn, _ = pretrained.load(DATA / "llama_yarn")
  assert yarn.rope_scaling.to_dict() == dict(
    rope_type="yarn", factor=4.0, original_max_position_embeddings=16
  )


@pytest.mark.parametrize(
  "case, change",
  [
    ("llama_llama3_tied", dict(rope_scaling=None)),
    ("llama_yarn", dict(rope_scaling=None)),
    ("mistral_sharded", dict(sliding_window=0)),
  ],
)
def test_the_reference_tells_scaling_and_window_apart(case, change):
  """Without the setting the logits move far past the tolerance: the parity tests above would
  catch a loader that dropped it."""
  config, params = pretrained.load(DATA / case)
  tokens, want = reference(case)
  assert (
    relative_error(logits_of(dataclasses.replace(config, **change), params, tokens), want)
    > 100 * RTOL
  )


# ------------------------------------------------------------------------------- exports


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_writes_transformers_own_tensors_and_loads_back(tmp_path, case):
  model_type, _ = CASES[case]
  config, params = pretrained.load(DATA / case)
  written = pretrained.save(tmp_path, config, params)
  assert written["format"] == model_type
  ours, theirs = load_file(written["weights"]), checkpoint_tensors(case)
  assert sorted(ours) == sorted(theirs)
  for name in theirs:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
  hf = json.loads(pathlib.Path(written["config"]).read_text())
  ref = json.loads((DATA / case / "config.json").read_text())
  for key in (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "layer_types",
  ):
    assert hf.get(key) == ref.get(key, hf.get(key)), key
  config2, params2 = pretrained.load(tmp_path)
  assert config2 == config
  assert_same_params(params2, params)


@pytest.mark.parametrize(
  "overrides, model_type",
  [
    (dict(), "llama"),
    (
      dict(
        n_kv_head=4,
        use_bias=True,
        tie_embeddings=True,
        rope_scaling=dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=16),
      ),
      "llama",
    ),
    (dict(qkv_bias=True, param_dtype="bfloat16"), "qwen2"),
    (dict(sliding_window=3, rope_scaling=dict(rope_type="linear", factor=2.0)), "mistral"),
    (dict(pos_encoding="rove"), "rove_jax"),  # no transformers model rotates values
    (dict(rope_layout="interleaved"), "rove_jax"),
  ],
)
def test_auto_export_picks_the_format_that_holds_the_model(tmp_path, overrides, model_type):
  config = llama_shaped(**overrides)
  params = random_params(config, seed=1)
  assert pretrained.save(tmp_path, config, params)["format"] == model_type
  assert json.loads((tmp_path / "config.json").read_text())["model_type"] == (
    "rove_jax_gpt" if model_type == "rove_jax" else model_type
  )
  config2, params2 = pretrained.load(tmp_path)
  assert config2 == config
  assert_same_params(params2, params)
  if model_type != "rove_jax":  # the config.json alone (no rove_jax section) gives it too
    hf = json.loads((tmp_path / "config.json").read_text())
    del hf["rove_jax"]
    derived, _ = hf_llama.load_llama(tmp_path, hf)
    for name in hf_llama.ARCHITECTURE:
      assert getattr(derived, name) == getattr(config, name), name


def test_a_format_that_cannot_hold_the_model_is_refused_with_reasons(tmp_path):
  config = llama_shaped(pos_encoding="rove", qkv_bias=True)
  params = random_params(config)
  with pytest.raises(ValueError, match=r"qwen2's format cannot hold.*pos_encoding='rove'"):
    pretrained.save(tmp_path, config, params, format="qwen2")
  with pytest.raises(ValueError, match=r"llama's format.*qkv_bias without use_bias"):
    pretrained.save(tmp_path, llama_shaped(qkv_bias=True), params, format="llama")
  with pytest.raises(ValueError, match=r"mistral's format.*norm='layernorm'"):
    pretrained.save(tmp_path, llama_shaped(norm="layernorm"), params, format="mistral")
  assert not (tmp_path / "config.json").exists()


# ---------------------------------------------------------------------------- refusals


def edited_config(case="llama_gqa", **changes):
  hf = json.loads((DATA / case / "config.json").read_text())
  for key, value in changes.items():
    if value is None:
      hf.pop(key, None)
    else:
      hf[key] = value
  return hf


@pytest.mark.parametrize(
  "case, changes, named",
  [
    ("llama_gqa", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("llama_gqa", dict(head_dim=16), "head_dim=16"),
    ("llama_gqa", dict(mlp_bias=True), "mlp_bias=true"),
    (
      "llama_gqa",
      dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)),
      "rope_type='dynamic'",
    ),
    (
      "llama_gqa",
      dict(rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e4, beta_fast=3)),
      r"unknown keys \['beta_fast'\]",
    ),
    (
      "llama_gqa",
      dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)),
      "partial_rotary_factor=0.5",
    ),
    (
      "qwen2",
      dict(layer_types=["full_attention", "sliding_attention"], sliding_window=4),
      "layer_types mixing",
    ),
    ("llama_gqa", dict(vocab_size=None), r"lacks \['vocab_size'\]"),
  ],
)
def test_settings_the_gpt_cannot_compute_are_refused_by_key(case, changes, named):
  with pytest.raises(ValueError, match=named):
    hf_llama.config_from_llama(edited_config(case, **changes))


def test_transformers_4_configs_read_the_same():
  """Checkpoints on the hub mostly carry transformers 4's keys: rope_theta and rope_scaling
  beside the other keys (no rope_parameters), Qwen2 without layer_types."""
  v5 = hf_llama.config_from_llama(edited_config("llama_llama3_tied"))
  rope = edited_config("llama_llama3_tied")["rope_parameters"]
  theta = rope.pop("rope_theta")
  v4 = edited_config(
    "llama_llama3_tied",
    rope_parameters=None,
    rope_theta=theta,
    rope_scaling={"type" if k == "rope_type" else k: v for k, v in rope.items()},
  )
  assert hf_llama.config_from_llama(v4) == v5
  qwen = edited_config(
    "qwen2",
    layer_types=None,
    rope_parameters=None,
    rope_theta=1e4,
    use_sliding_window=False,
    sliding_window=131072,
    max_window_layers=1,
  )
  assert hf_llama.config_from_llama(qwen) == hf_llama.config_from_llama(edited_config("qwen2"))


def test_qwen2_with_a_window_on_every_layer_loads_with_the_window():
  hf = edited_config(
    "qwen2", layer_types=None, use_sliding_window=True, sliding_window=6, max_window_layers=0
  )
  assert hf_llama.config_from_llama(hf).sliding_window == 6


def test_bad_tensors_and_unknown_types_are_named(tmp_path):
  tensors = checkpoint_tensors("qwen2")
  tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0  # tied, but differs
  save_file(tensors, tmp_path / "model.safetensors")
  (tmp_path / "config.json").write_text(json.dumps(edited_config("qwen2")))
  with pytest.raises(ValueError, match="lm_head.weight differs"):
    pretrained.load(tmp_path)
  del tensors["lm_head.weight"], tensors["model.layers.1.self_attn.v_proj.bias"]
  tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)  # skipped
  save_file(tensors, tmp_path / "model.safetensors")
  with pytest.raises(ValueError, match=r"missing \['model.layers.1.self_attn.v_proj.bias'\]"):
    pretrained.load(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps(edited_config(model_type="gemma")))
  with pytest.raises(ValueError, match="model_type 'gemma'.*'llama', 'qwen2', 'mistral'"):
    pretrained.load(tmp_path)


# --------------------------------------------------- the model settings the mapping needs


def test_qkv_bias_puts_biases_on_q_k_v_only():
  for n_kv_head, names in ((4, {"bqkv"}), (2, {"bq", "bkv"})):
    config = llama_shaped(n_kv_head=n_kv_head, qkv_bias=True, n_layer=1)
    attn = {n.split(".")[-1] for n in param_files.named(random_params(config)) if ".attn." in n}
    assert attn & {"bqkv", "bq", "bkv", "bo"} == names
  with pytest.raises(ValueError, match="qkv_bias must be true or false"):
    llama_shaped(qkv_bias="yes")


def test_sliding_window_sees_exactly_the_last_w_tokens():
  """One layer of RoPE depends on relative positions only, so with a window of w the last
  token's logits equal those of the model run on the last w tokens alone."""
  w = 4
  config = llama_shaped(n_layer=1, sliding_window=w)
  params = random_params(config, seed=3)
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, 12)).astype(np.int32)
  full = logits_of(config, params, tokens)
  np.testing.assert_allclose(
    full[:, -1],
    logits_of(config, params, tokens[:, -w:])[:, -1],
    rtol=1e-5,
    atol=1e-5 * np.abs(full).max(),
  )
  for kernel in ("chunked", "reference"):  # every kernel that takes a window masks the same
    other = logits_of(
      dataclasses.replace(config, attention_impl=kernel, attention_chunk=4), params, tokens
    )
    assert relative_error(other, full) <= 1e-5, kernel
  unwindowed = logits_of(dataclasses.replace(config, sliding_window=0), params, tokens)
  assert relative_error(unwindowed[:, -1], full[:, -1]) > 1e-3
  with pytest.raises(ValueError, match="sliding_window must be an int >= 0"):
    llama_shaped(sliding_window=-1)
  for kernel in ("cudnn", "splash", "fused"):
    with pytest.raises(ValueError, match=f"attention_impl='{kernel}' masks no sliding window"):
      llama_shaped(sliding_window=4, attention_impl=kernel)


def test_sliding_window_cached_decoding_equals_the_full_forward():
  config = llama_shaped(sliding_window=3)
  model = pretrained.build(config, random_params(config, seed=4))
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (1, 9)), jnp.int32)
  full = np.asarray(model(tokens))
  cache = model.init_cache(1, 9)
  logits, cache = model(tokens[:, :5], cache=cache)
  steps = [np.asarray(logits)]
  for t in range(5, 9):
    logits, cache = model(tokens[:, t : t + 1], cache=cache)
    steps.append(np.asarray(logits))
  np.testing.assert_allclose(
    np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5 * np.abs(full).max()
  )


# ------------------------------------------------- exports for transformers to load (two venvs)


def write_exports(root) -> list:
  """Exports, under root, every reference checkpoint as loaded and a few models rove-jax made
  (the auto format of each), each with expected.npz (tokens, rove-jax's float32 logits) for
  scripts/llama_reference.py --check."""
  root = pathlib.Path(root)
  models = {case: pretrained.load(DATA / case) for case in CASES}
  for name, overrides in {
    "made_llama_yarn_tied": dict(
      n_kv_head=4,
      use_bias=True,
      tie_embeddings=True,
      rope_scaling=dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=16),
    ),
    "made_qwen2": dict(qkv_bias=True),
    "made_mistral_window_linear": dict(
      sliding_window=3, rope_scaling=dict(rope_type="linear", factor=2.0)
    ),
  }.items():
    config = llama_shaped(**overrides)
    models[name] = (config, random_params(config, seed=5))
  out = []
  for name, (config, params) in models.items():
    tokens = np.random.default_rng(7).integers(0, config.vocab_size, (2, 20)).astype(np.int32)
    written = pretrained.save(root / name, config, params)
    np.savez(root / name / "expected.npz", tokens=tokens, logits=logits_of(config, params, tokens))
    out.append(f"{root / name} ({written['format']})")
  return out


if __name__ == "__main__":
  for p in write_exports(sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama_exports"):
    print(p)
