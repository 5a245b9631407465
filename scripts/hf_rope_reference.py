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
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.glm import modeling_glm
from transformers.models.gpt_neox import modeling_gpt_neox
from transformers.models.llama import modeling_llama
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding

HEADS = {64: [1.0, 0.5, 0.25], 80: [1.0, 0.4], 128: [1.0, 0.75]}  # head_dim: partial factors
PAIRS = [(d, p) for d, ps in HEADS.items() for p in ps]
SOME_PAIRS = [(64, 1.0), (64, 0.5), (80, 0.4), (128, 0.75)]  # for the option variants


def f32_list(t):
  """float32 values, each written with the fewest digits that read back to the same float32."""
  return [
    float(np.format_float_scientific(x, unique=True)) for x in np.asarray(t, np.float32).reshape(-1)
  ]


def nested(t, digits=6):
  """An array as nested lists rounded to `digits` decimals (attention outputs)."""
  return np.round(np.asarray(t, np.float64), digits).tolist()


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


def model_cases():
  rng = np.random.default_rng(1515)
  longrope = lambda n: (
    np.round(1 + 0.1 * rng.random(n), 4).tolist(),
    np.round(np.sort(1 + 30 * rng.random(n)), 4).tolist(),
  )
  phi3_short, phi3_long = longrope(48)
  phi4_short, phi4_long = longrope(48)
  cases = [
    (
      "Llama-3.1-8B (v4)",
      "llama",
      dict(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={
          "factor": 8.0,
          "low_freq_factor": 1.0,
          "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192,
          "rope_type": "llama3",
        },
      ),
      [None],
    ),
    (
      "Llama-2 linear x4 (v4 'type')",
      "llama",
      dict(
        hidden_size=4096,
        num_attention_heads=32,
        max_position_embeddings=16384,
        rope_scaling={"type": "linear", "factor": 4.0},
      ),
      [None],
    ),
    (
      "Llama dynamic (v4)",
      "llama",
      dict(
        hidden_size=2048,
        num_attention_heads=16,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rope_scaling={"type": "dynamic", "factor": 2.0},
      ),
      [None, 16384],
    ),
    (
      "Qwen2.5 YaRN (v4)",
      "qwen2",
      dict(
        hidden_size=3584,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
      ),
      [None],
    ),
    (
      "Phi-3-mini-128k (v4, top-level original length)",
      "phi3",
      dict(
        hidden_size=3072,
        num_attention_heads=32,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_theta=10000.0,
        rope_scaling={"type": "longrope", "short_factor": phi3_short, "long_factor": phi3_long},
      ),
      [None, 4096, 8192],
    ),
    (
      "Phi-4-mini (v4, partial 0.75, longrope)",
      "phi3",
      dict(
        hidden_size=3072,
        num_attention_heads=24,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        partial_rotary_factor=0.75,
        rope_theta=10000.0,
        rope_scaling={"type": "longrope", "short_factor": phi4_short, "long_factor": phi4_long},
      ),
      [None, 65536],
    ),
    (
      "phi-2 (v4, partial 0.4)",
      "phi",
      dict(
        hidden_size=2560,
        num_attention_heads=32,
        max_position_embeddings=2048,
        partial_rotary_factor=0.4,
        rope_theta=10000.0,
      ),
      [None],
    ),
    (
      "Pythia (v4 rotary_pct / rotary_emb_base)",
      "gpt_neox",
      dict(
        hidden_size=512,
        num_attention_heads=8,
        max_position_embeddings=2048,
        rotary_pct=0.25,
        rotary_emb_base=10000,
      ),
      [None],
    ),
    (
      "GLM-4 (v5 rope_parameters, partial 0.5)",
      "glm",
      dict(
        hidden_size=4096,
        num_attention_heads=32,
        head_dim=128,
        max_position_embeddings=131072,
        rope_parameters={
          "rope_type": "default",
          "rope_theta": 10000.0,
          "partial_rotary_factor": 0.5,
        },
      ),
      [None],
    ),
    (
      "StableLM YaRN (v5, partial 0.25)",
      "stablelm",
      dict(
        hidden_size=2560,
        num_attention_heads=32,
        max_position_embeddings=16384,
        rope_parameters={
          "rope_type": "yarn",
          "rope_theta": 10000.0,
          "factor": 4.0,
          "original_max_position_embeddings": 4096,
          "partial_rotary_factor": 0.25,
        },
      ),
      [None],
    ),
    (
      "Llama linear with ignored attention_factor (v5)",
      "llama",
      dict(
        hidden_size=1024,
        num_attention_heads=8,
        max_position_embeddings=8192,
        rope_parameters={
          "rope_type": "linear",
          "rope_theta": 10000.0,
          "factor": 2.0,
          "attention_factor": 1.5,
        },
      ),
      [None],
    ),
  ]
  out = []
  for name, model_type, cfg_dict, seq_lens in cases:
    cfg = AutoConfig.for_model(model_type, **json.loads(json.dumps(cfg_dict)))
    module = __import__(f"transformers.models.{model_type}.modeling_{model_type}", fromlist=["x"])
    (cls,) = [
      getattr(module, n)
      for n in dir(module)
      if n.endswith("RotaryEmbedding") and n != "RotaryEmbedding" and "Vision" not in n
    ]
    for seq_len in seq_lens:
      emb = cls(cfg)
      if seq_len is not None:
        emb(torch.zeros(1), torch.tensor([[seq_len - 1]]))
      inv = emb.inv_freq
      out.append(
        dict(
          name=name,
          model_type=model_type,
          config={"model_type": model_type, **cfg_dict},
          seq_len=seq_len,
          rot_dim=2 * int(inv.shape[0]),
          inv_freq=f32_list(inv),
          attention_factor=float(emb.attention_scaling),
        )
      )
  return out


def attention_cases():
  """Eager attention (llama's eager_attention_forward, causal) over rotated q, k."""
  out = []

  def run(name, layout, model_type, head_dim, rope_parameters, max_pos, q, k, v, positions):
    cfg = AutoConfig.for_model(
      model_type,
      hidden_size=head_dim * q.shape[2],
      num_attention_heads=q.shape[2],
      head_dim=head_dim,
      num_key_value_heads=k.shape[2],
      max_position_embeddings=max_pos,
      rope_parameters=dict(rope_parameters),
    )
    if model_type == "gpt_neox":
      emb, apply = modeling_gpt_neox.GPTNeoXRotaryEmbedding(cfg), modeling_gpt_neox
    else:
      emb, apply = modeling_glm.GlmRotaryEmbedding(cfg), modeling_glm
    qt, kt, vt = (torch.tensor(np.asarray(x, np.float32)).transpose(1, 2) for x in (q, k, v))
    pos = torch.tensor(positions)
    cos, sin = emb(qt, pos)
    q_rot, k_rot = apply.apply_rotary_pos_emb(qt, kt, cos, sin)
    T = q.shape[1]
    mask = torch.where(
      pos[:, None, :, None] >= pos[:, None, None, :], 0.0, torch.finfo(torch.float32).min
    )
    module = argparse.Namespace(num_key_value_groups=q.shape[2] // k.shape[2], training=False)
    y, _ = modeling_llama.eager_attention_forward(
      module, q_rot, k_rot, vt, mask, scaling=head_dim**-0.5
    )
    assert y.shape == (q.shape[0], T, q.shape[2], head_dim)
    out.append(
      dict(
        name=name,
        layout=layout,
        head_dim=head_dim,
        rope_parameters=rope_parameters,
        max_position_embeddings=max_pos,
        inv_freq=f32_list(emb.inv_freq),
        attention_factor=float(emb.attention_scaling),
        positions=positions,
        q=q.tolist(),
        k=k.tolist(),
        v=v.tolist(),
        out=nested(y.numpy()),
      )
    )

  # The partial-rotary reproducer: D=4, rot_dim 2 (inv_freq [1.0]), factor 1.5 fixed.
  q = np.array([[1, 0, 1, 0], [1, 0, 1, 0]], np.float64)[None, :, None]
  k = np.array([[1, 0, 0, 0], [0, 0, 1, 0]], np.float64)[None, :, None]
  v = np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float64)[None, :, None]
  run(
    "partial-rotary reproducer",
    "half",
    "gpt_neox",
    4,
    {
      "rope_type": "yarn",
      "rope_theta": 10000.0,
      "partial_rotary_factor": 0.5,
      "factor": 4.0,
      "original_max_position_embeddings": 2,
      "attention_factor": 1.5,
    },
    8,
    q,
    k,
    v,
    [[0, 1]],
  )
  rng = np.random.default_rng(150)

  def qkv(B, T, H, K, D):
    r = lambda *s: np.round(rng.standard_normal(s), 3)
    return r(B, T, H, D), r(B, T, K, D), r(B, T, K, D)

  positions = [list(range(5, 5 + 3 * 7, 3))]
  shapes = ((16, 0.5, 4.0), (32, 0.25, 16.0), (16, 1.0, 8.0))  # (D, partial, factor)
  for layout, model_type, cases in (
    ("half", "gpt_neox", shapes),
    ("interleaved", "glm", shapes[::2]),
  ):
    for D, p, f in cases:
      run(
        f"yarn D={D} partial {p} factor {f}",
        layout,
        model_type,
        D,
        {
          "rope_type": "yarn",
          "rope_theta": 100.0,
          "partial_rotary_factor": p,
          "factor": f,
          "original_max_position_embeddings": 8,
        },
        int(8 * f),
        *qkv(1, 7, 2, 1, D),
        positions,
      )
  # LongRoPE at D=16, partial 0.5 (4 pairs): positions up to 23 > 8, the long factors.
  run(
    "longrope D=16 partial 0.5 long",
    "half",
    "gpt_neox",
    16,
    {
      "rope_type": "longrope",
      "rope_theta": 100.0,
      "partial_rotary_factor": 0.5,
      "short_factor": [1.0, 1.1, 1.2, 1.3],
      "long_factor": [1.0, 2.0, 4.0, 8.0],
      "original_max_position_embeddings": 8,
    },
    64,
    *qkv(1, 7, 2, 1, 16),
    positions,
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
