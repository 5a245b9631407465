"""The "models" table of tests/reference_data/hf_rope_reference.json (scripts/hf_rope_reference.py
writes it: run that): config.json dicts shaped like public models' (v4 and v5 spellings) through
AutoConfig and that model's RotaryEmbedding, i.e. what `rope_from_hf_config` must read.
"""

import json

import numpy as np
import torch
from hf_rope_reference_values import f32_list
from transformers import AutoConfig


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
