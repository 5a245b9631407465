"""The "attention" table of tests/reference_data/hf_rope_reference.json
(scripts/hf_rope_reference.py writes it: run that): eager softmax attention over transformers'
apply_rotary_pos_emb (GPT-NeoX's for layout "half", GLM's for "interleaved") with the model's
cos / sin, i.e. with the attention factor on the rotated dims only: the partial-rotary
reproducer and random partial-rotary YaRN / LongRoPE cases.
"""

import argparse

import numpy as np
import torch
from hf_rope_reference_values import f32_list, nested
from transformers import AutoConfig
from transformers.models.glm import modeling_glm
from transformers.models.gpt_neox import modeling_gpt_neox
from transformers.models.llama import modeling_llama


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
