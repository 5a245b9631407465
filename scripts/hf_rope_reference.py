"""Writes tests/reference_data/hf_rope_reference.json: RoPE tables and attention outputs from
transformers.

tests/core/test_hf_rope.py compares rove_jax against this file; transformers and torch are not test
dependencies, only this script's. Run it once in a separate environment (the CPU torch wheel):

    python3 -m venv /work/hfvenv
    /work/hfvenv/bin/pip install 'transformers>=5' torch numpy   # torch: the CPU wheel
    /work/hfvenv/bin/python scripts/hf_rope_reference.py \\
        [--out tests/reference_data/hf_rope_reference.json]

Three tables:
  scaling    every transformers rope type across head_dim x partial_rotary_factor x base x factor
             x lengths, from the model classes' own RotaryEmbedding (GPT-NeoX's, which supports
             partial rotary and every rope type; "proportional" from ROPE_INIT_FUNCTIONS and
             "axial" from Qwen3-VL's vision embedding), with the current length set by a forward
             call at position seq_len - 1 as generation does (so dynamic and longrope update).
  models     config.json dicts shaped like public models' (v4 and v5 spellings) through
             AutoConfig and that model's RotaryEmbedding: what `rope_from_hf_config` must read.
  attention  eager softmax attention over transformers' apply_rotary_pos_emb (GPT-NeoX's for
             layout "half", GLM's for "interleaved") with the model's cos / sin, i.e. with the
             attention factor on the rotated dims only: the partial-rotary reproducer and random
             partial-rotary YaRN / LongRoPE cases.
Inputs are rounded to 3 decimals so both sides read the same float32 values.

This script computes the scaling table; hf_rope_reference_models.py and
hf_rope_reference_attention.py (beside it) the other two, hf_rope_reference_values.py how
values are written.
"""

import argparse
import itertools
import json
import logging
import os
import warnings

import numpy as np
import torch
import transformers
from hf_rope_reference_attention import attention_cases
from hf_rope_reference_models import model_cases
from hf_rope_reference_values import f32_list
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox import modeling_gpt_neox
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding

HEADS = {64: [1.0, 0.5, 0.25], 80: [1.0, 0.4], 128: [1.0, 0.75]}  # head_dim: partial factors
PAIRS = [(d, p) for d, ps in HEADS.items() for p in ps]
SOME_PAIRS = [(64, 1.0), (64, 0.5), (80, 0.4), (128, 0.75)]  # for the option variants


def neox_rope(head_dim, rope_parameters, max_pos, seq_len=None):
  """(inv_freq, attention_scaling) of GPT-NeoX's RotaryEmbedding after a call at seq_len."""
  cfg = AutoConfig.for_model(
    "gpt_neox",
    hidden_size=head_dim * 2,
    num_attention_heads=2,
    max_position_embeddings=max_pos,
    rope_parameters=dict(rope_parameters),
  )
  emb = modeling_gpt_neox.GPTNeoXRotaryEmbedding(cfg)
  if seq_len is not None:
    emb(torch.zeros(1), torch.tensor([[seq_len - 1]]))
  return emb.inv_freq, float(emb.attention_scaling)


def scaling_cases():
  out = []

  def add(method, head_dim, params, max_pos=4096, seq_len=None, note=""):
    # Always explicit: GPT-NeoX's config defaults partial_rotary_factor to 0.25.
    params = {"rope_type": method, "partial_rotary_factor": 1.0, **params}
    inv, att = neox_rope(head_dim, params, max_pos, seq_len)
    out.append(
      dict(
        method=method,
        head_dim=head_dim,
        rope_parameters=params,
        max_position_embeddings=max_pos,
        seq_len=seq_len,
        inv_freq=f32_list(inv),
        attention_factor=att,
        note=note,
      )
    )

  for (d, p), base in itertools.product(PAIRS, [1e4, 1e6]):
    add("default", d, {"rope_theta": base, "partial_rotary_factor": p})
  for (d, p), (base, f) in itertools.product(PAIRS, [(1e4, 2.0), (5e5, 8.0)]):
    add("linear", d, {"rope_theta": base, "partial_rotary_factor": p, "factor": f})
  for i, ((d, p), seq) in enumerate(itertools.product(PAIRS, [2048, 4096, 10001])):
    base, f = (1e6 if d == 80 else 1e4), (2.0, 4.0)[i % 2]
    add(
      "dynamic",
      d,
      {"rope_theta": base, "partial_rotary_factor": p, "factor": f},
      max_pos=2048,
      seq_len=seq,
    )
  add(
    "dynamic",
    64,
    {"rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 1024},
    max_pos=4096,
    seq_len=4096,
    note="v5-dict case 4: the dict's original length is ignored",
  )
  add(
    "dynamic",
    64,
    {"rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 1024},
    max_pos=4096,
    seq_len=8192,
    note="v5-dict case 4 past max_position_embeddings",
  )
  for (d, p), s in itertools.product(PAIRS, [2, 8]):  # NTK-aware base change s: dynamic, factor 1
    add(
      "dynamic",
      d,
      {"rope_theta": 1e4, "partial_rotary_factor": p, "factor": 1.0},
      max_pos=1024,
      seq_len=1024 * s,
      note=f"ntk:{s}",
    )
  for (d, p), base, (f, orig) in itertools.product(
    PAIRS, [1e4, 1e6], [(2.0, 2048), (4.0, 4096), (16.0, 2048)]
  ):
    add(
      "yarn",
      d,
      {
        "rope_theta": base,
        "partial_rotary_factor": p,
        "factor": f,
        "original_max_position_embeddings": orig,
      },
      max_pos=int(f * orig),
    )
  variants = [
    ({"beta_fast": 16, "beta_slow": 2}, 4096, ""),
    ({"truncate": False}, 4096, ""),
    ({"mscale": 1.0, "mscale_all_dim": 0.707}, 4096, "DeepSeek mscale"),
    ({"mscale": 0.707, "mscale_all_dim": 0.707}, 4096, "DeepSeek mscale, equal"),
    ({"attention_factor": 1.2}, 4096, "explicit attention factor"),
    ({"factor": None}, 16384, "factor from max / original"),
    (
      {"factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
      163840,
      "DeepSeek-V3 values",
    ),
  ]
  for (d, p), (extra, max_pos, note) in itertools.product(SOME_PAIRS, variants):
    add(
      "yarn",
      d,
      {
        "rope_theta": 1e4,
        "partial_rotary_factor": p,
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        **extra,
      },
      max_pos=max_pos,
      note=note,
    )
  for (d, p), (f, orig, low, high) in itertools.product(
    PAIRS, [(8.0, 8192, 1.0, 4.0), (32.0, 8192, 1.0, 4.0), (4.0, 2048, 2.0, 8.0)]
  ):
    add(
      "llama3",
      d,
      {
        "rope_theta": 5e5,
        "partial_rotary_factor": p,
        "factor": f,
        "original_max_position_embeddings": orig,
        "low_freq_factor": low,
        "high_freq_factor": high,
      },
      max_pos=int(f * orig),
    )
  rng = np.random.default_rng(15)
  for d, p in PAIRS:
    n = int(d * p) // 2
    short = np.round(1.0 + 0.2 * rng.random(n), 4).tolist()
    long = np.round(np.sort(1.0 + 40.0 * rng.random(n)), 4).tolist()
    lr = {
      "rope_theta": 1e4,
      "partial_rotary_factor": p,
      "short_factor": short,
      "long_factor": long,
      "original_max_position_embeddings": 4096,
    }
    for seq in (None, 4097):
      add("longrope", d, lr, max_pos=131072, seq_len=seq, note="factor from max / original")
    add(
      "longrope",
      d,
      {**lr, "factor": 4.0},
      max_pos=131072,
      seq_len=8192,
      note="v5-dict case 3: explicit factor",
    )
    add(
      "longrope",
      d,
      {**lr, "attention_factor": 1.3},
      max_pos=131072,
      seq_len=100,
      note="explicit attention factor",
    )
  for d, p, (f, base) in itertools.product([64, 128], [0.25, 0.5, 1.0], [(1.0, 1e4), (8.0, 1e6)]):
    params = {
      "rope_type": "proportional",
      "rope_theta": base,
      "partial_rotary_factor": p,
      "factor": f,
    }
    cfg = AutoConfig.for_model(
      "llama", hidden_size=d * 2, num_attention_heads=2, head_dim=d, rope_parameters=dict(params)
    )
    inv, att = ROPE_INIT_FUNCTIONS["proportional"](cfg)
    out.append(
      dict(
        method="proportional",
        head_dim=d,
        rope_parameters=params,
        max_position_embeddings=cfg.max_position_embeddings,
        seq_len=None,
        inv_freq=f32_list(inv),
        attention_factor=float(att),
        note="",
      )
    )
  for d, base in itertools.product([64, 80, 128], [1e4, 1e6]):
    params = {"rope_type": "axial", "rope_theta": base}
    cfg = argparse.Namespace(rope_parameters=params, head_dim=d)
    inv, att = Qwen3VLVisionRotaryEmbedding.compute_axial_rope_parameters(cfg)
    out.append(
      dict(
        method="axial",
        head_dim=d,
        rope_parameters=params,
        max_position_embeddings=None,
        seq_len=None,
        inv_freq=f32_list(inv),
        attention_factor=float(att),
        note="one table, used for both axes",
      )
    )
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  here = os.path.dirname(os.path.abspath(__file__))
  parser.add_argument(
    "--out", default=os.path.join(here, "..", "tests", "reference_data", "hf_rope_reference.json")
  )
  args = parser.parse_args()
  transformers.logging.set_verbosity_error()
  logging.disable(logging.WARNING)
  warnings.simplefilter("ignore")
  torch.set_grad_enabled(False)
  data = {
    "generator": "scripts/hf_rope_reference.py",
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "scaling": scaling_cases(),
    "models": model_cases(),
    "attention": attention_cases(),
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(data, f, separators=(",", ":"))
    f.write("\n")
  size = os.path.getsize(args.out)
  print(
    f"wrote {args.out}: {len(data['scaling'])} scaling, {len(data['models'])} model, "
    f"{len(data['attention'])} attention cases, {size / 1024:.0f} KiB"
  )


if __name__ == "__main__":
  main()
