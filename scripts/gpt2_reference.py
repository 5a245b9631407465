"""transformers' side of the GPT-2 interop tests (tests/nn/test_hf_gpt2.py): torch and
transformers are this script's dependencies, never the project's. Run it in a separate
environment:

    python3 -m venv /tmp/hfref && /tmp/hfref/bin/pip install torch transformers safetensors
    /tmp/hfref/bin/python scripts/gpt2_reference.py   # writes tests/reference_data/gpt2_tiny/
    python -m tests.nn.test_hf_gpt2 D                              # the project's venv
    /tmp/hfref/bin/python scripts/gpt2_reference.py --check D

Default: writes the tiny transformers GPT-2 checkpoint and its logits into
tests/reference_data/gpt2_tiny/:
  config.json, model.safetensors  GPT2LMHeadModel.save_pretrained (tied lm_head, so the file
                                  holds no lm_head.weight; names carry "transformer.")
  reference.json                  the token ids, the versions used and the seed
  logits.npy                      transformers' float32 logits [B, T, V] of those tokens
Every parameter is redrawn at a scale that makes each one matter (biases, LayerNorm gains and
offsets included; GPT-2's own init leaves biases at zero and gains at one, which would hide a
mismapped bias), so a wrong transpose, split or head order changes the logits visibly.

--check D: for every subdirectory of D holding an export (rove-jax GPT-2 exports written by
`python -m tests.nn.test_hf_gpt2 D`, each with expected.npz beside model.safetensors: tokens and
rove-jax's logits), loads it with
GPT2LMHeadModel.from_pretrained and prints the largest logit difference; exit status 1 when
one exceeds 1e-5 of the logits' scale.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "reference_data", "gpt2_tiny")
SEED = 0
RTOL = 1e-5


def write_reference(out: str):
  torch.manual_seed(SEED)
  config = GPT2Config(
    vocab_size=64,
    n_positions=16,
    n_embd=16,
    n_layer=2,
    n_head=2,
    activation_function="gelu_new",
    layer_norm_epsilon=1e-5,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    bos_token_id=0,
    eos_token_id=0,
  )
  model = GPT2LMHeadModel(config).eval()
  gen = torch.Generator().manual_seed(SEED)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
      if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        p.copy_(1.0 + 0.2 * noise)
      else:
        p.copy_(0.3 * noise)
  model.save_pretrained(out)
  extra = os.path.join(out, "generation_config.json")
  if os.path.exists(extra):
    os.remove(extra)
  tokens = torch.randint(0, config.vocab_size, (2, config.n_positions), generator=gen)
  with torch.no_grad():
    logits = model(tokens).logits.numpy().astype(np.float32)
  np.save(os.path.join(out, "logits.npy"), logits)
  with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump(
      {
        "tokens": tokens.tolist(),
        "seed": SEED,
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
    model = GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
      got = model(torch.as_tensor(expected["tokens"])).logits.float().numpy()
    want = expected["logits"]
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    worst = max(worst, err)
    print(
      f"{d}: transformers {transformers.__version__} vs rove-jax logits {want.shape}: "
      f"max |diff| / max |logit| = {err:.2e}"
    )
  return int(worst > RTOL)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=OUT)
  parser.add_argument("--check", help="a directory of rove-jax GPT-2 exports to load")
  args = parser.parse_args()
  if args.check:
    sys.exit(check_exports(args.check))
  write_reference(args.out)


if __name__ == "__main__":
  main()
