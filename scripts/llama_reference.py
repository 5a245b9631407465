"""transformers' side of the Llama-family interop tests (tests/nn/test_hf_llama.py): torch and
transformers are this script's dependencies, never the project's. Run it in a separate
environment:

    python3 -m venv /tmp/hfref && /tmp/hfref/bin/pip install torch transformers safetensors
    /tmp/hfref/bin/python scripts/llama_reference.py     # writes tests/reference_data/llama_family/
    python -m tests.nn.test_hf_llama D                   # the project's venv: exports into D
    /tmp/hfref/bin/python scripts/llama_reference.py --check D

Default: writes one tiny random checkpoint per case of CASES into
tests/reference_data/llama_family/<case>/, each saved by transformers' save_pretrained:
  config.json, model.safetensors  (or model-0000k-of-0000n.safetensors + the index: "sharded")
  reference.json                  the token ids, the versions used and the seed
  logits.npy                      transformers' float32 logits [B, T, V] of those tokens
Every parameter is redrawn at random (RMSNorm gains around 1, biases included), so a wrong
transpose, head order, rotary pairing or bias changes the logits visibly.

--check D: for every subdirectory of D holding a rove-jax export with expected.npz (tokens and
rove-jax's logits), loads it with AutoModelForCausalLM.from_pretrained and prints the largest
logit difference relative to the largest logit; exit status 1 when one exceeds 1e-5.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "reference_data", "llama_family")
SEED = 0
RTOL = 1e-5
TOKENS = (2, 24)  # rows, length: longer than mistral's window, past yarn's original length

_BASE = dict(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  num_attention_heads=4,
  rms_norm_eps=1e-6,
  max_position_embeddings=64,
  attention_dropout=0.0,
  bos_token_id=0,
  eos_token_id=0,
  pad_token_id=None,
)
# case: (model_type, config overrides, save_pretrained keywords)
CASES = {
  # GQA (4 query heads, 2 kv heads), untied head, plain RoPE, no biases
  "llama_gqa": (
    "llama",
    dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500.0),
    {},
  ),
  # multi-head (K == H), tied head, biases on all four projections, Llama 3 scaling
  "llama_llama3_tied": (
    "llama",
    dict(
      num_key_value_heads=4,
      tie_word_embeddings=True,
      attention_bias=True,
      rope_parameters=dict(
        rope_type="llama3",
        rope_theta=100.0,
        factor=4.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,
      ),
    ),
    {},
  ),
  # GQA, YaRN (factor 4 from 16 positions), untied
  "llama_yarn": (
    "llama",
    dict(
      num_key_value_heads=2,
      tie_word_embeddings=False,
      rope_parameters=dict(
        rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=16
      ),
    ),
    {},
  ),
  # q/k/v biases without an output bias, GQA, tied (as the small Qwen2 models are)
  "qwen2": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0), {}),
  # sliding window of 5 over 24 tokens, GQA, untied, written as transformers' shards
  "mistral_sharded": (
    "mistral",
    dict(num_key_value_heads=1, tie_word_embeddings=False, sliding_window=5, rope_theta=1000.0),
    dict(max_shard_size="40KB"),
  ),
}


def _config(model_type: str, overrides: dict):
  return AutoConfig.for_model(model_type, **{**_BASE, **overrides})


def write_case(out: str, model_type: str, overrides: dict, save_kw: dict):
  torch.manual_seed(SEED)
  config = _config(model_type, overrides)
  model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
  gen = torch.Generator().manual_seed(SEED)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
      p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.2 * noise)
  os.makedirs(out, exist_ok=True)
  model.save_pretrained(out, **save_kw)
  extra = os.path.join(out, "generation_config.json")
  if os.path.exists(extra):
    os.remove(extra)
  tokens = torch.randint(0, config.vocab_size, TOKENS, generator=gen)
  with torch.no_grad():
    logits = model(tokens).logits.numpy().astype(np.float32)
  np.save(os.path.join(out, "logits.npy"), logits)
  with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump(
      {
        "tokens": tokens.tolist(),
        "seed": SEED,
        "model_type": model_type,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
      },
      f,
      indent=1,
    )
    f.write("\n")
  print(f"wrote {out}: logits {logits.shape}, |logits| max {np.abs(logits).max():.3f}")


def check_exports(root: str) -> int:
  worst = 0.0
  dirs = sorted(
    d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "expected.npz"))
  )
  if not dirs:
    print(f"no exports with expected.npz under {root}")
    return 1
  for d in dirs:
    path = os.path.join(root, d)
    expected = np.load(os.path.join(path, "expected.npz"))
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
      got = model(torch.as_tensor(expected["tokens"])).logits.float().numpy()
    want = expected["logits"]
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    worst = max(worst, err)
    print(
      f"{d}: {type(model).__name__}, transformers {transformers.__version__} vs rove-jax "
      f"logits {want.shape}: max |diff| / max |logit| = {err:.2e}"
    )
  return int(worst > RTOL)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=OUT)
  parser.add_argument("--check", help="a directory of rove-jax exports to load")
  args = parser.parse_args()
  if args.check:
    sys.exit(check_exports(args.check))
  for name, (model_type, overrides, save_kw) in CASES.items():
    write_case(os.path.join(args.out, name), model_type, overrides, save_kw)


if __name__ == "__main__":
  main()
