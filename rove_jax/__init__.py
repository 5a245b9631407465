"""rove-jax: Rotary Value Embeddings (RoVE) and RoPE attention for JAX / Flax.

Stable names:
  rope_frequencies, axial_frequencies, rotate, rotation_matrix, Rope  (rove_jax.rotary)
  rope_attention, rove_attention, masked_attention               (rove_jax.attention)
  Mask (which keys each query sees), kernels.select              (rove_jax.kernels)
  scaling.linear / ntk / dynamic_ntk / yarn / dynamic_yarn / llama3 / longrope / from_config
  scaling.RopeScaling (a transformers rope dict parsed once into one spec per rope_type:
    from_dict, to_dict, frequencies)
  rope_from_hf_config (a transformers config.json's rot_dim, inv_freq, attention factor)
  analysis.value_kernel, analysis.mixer_matrix

Shape letters, one meaning each in every module of the package (tensors are named with them,
e.g. q_BTHD; module docstrings list only the letters they use):
  B  batch (per process)                     T  query tokens / sequence length
  S  key/value tokens                        W  window length: T + 1 (inputs and targets)
  H  query heads                             K  key/value heads
  G  query heads per key/value head: H // K  D  head dimension
  P  rotary pairs (2P <= D)                  A  position axes (1 text, 2 images, 3 video)
  E  model width (d_model)                   F  MLP hidden width (d_ff)
  V  vocabulary                              L  KV-cache capacity (slots)
  N  entries of a flat array (a token stream, a list of offsets)
  M  gradient-accumulation micro-steps       U  T5 relative-position buckets
"""

from rove_jax import analysis, attention, kernels, rotary, scaling
from rove_jax.attention import (
  masked_attention,
  rope_attention,
  rove_attention,
  rove_attention_rotated,
)
from rove_jax.hf_rope import rope_from_hf_config
from rove_jax.kernels import Mask
from rove_jax.rotary import (
  Rope,
  apply_rotary,
  axial_frequencies,
  rope_frequencies,
  rotary_tables,
  rotate,
  rotation_angles,
  rotation_matrix,
)

__version__ = "0.1.0"

__all__ = [
  "analysis",
  "attention",
  "kernels",
  "rotary",
  "scaling",
  "rope_attention",
  "rove_attention",
  "rove_attention_rotated",
  "masked_attention",
  "Rope",
  "Mask",
  "rope_frequencies",
  "axial_frequencies",
  "rotate",
  "rotation_matrix",
  "rotation_angles",
  "rotary_tables",
  "apply_rotary",
  "rope_from_hf_config",
]
