"""rove-jax: Rotary Value Embeddings (RoVE) and RoPE attention for JAX / Flax.

Stable names:
  rope_frequencies, axial_frequencies, rotate, rotation_matrix   (rove_jax.rotary)
  rope_attention, rove_attention                                 (rove_jax.attention)
  scaling.linear / ntk / dynamic_ntk / yarn / dynamic_yarn / llama3 / longrope / from_config
  analysis.value_kernel, analysis.mixer_matrix
"""

from rove_jax import analysis, attention, rotary, scaling
from rove_jax.attention import attention_mask, masked_attention, rope_attention, rove_attention
from rove_jax.rotary import (apply_rotary, axial_frequencies, rope_frequencies, rotary_tables,
                             rotate, rotation_angles, rotation_matrix)

__version__ = "0.1.0"

__all__ = [
    "analysis", "attention", "rotary", "scaling",
    "rope_attention", "rove_attention", "masked_attention", "attention_mask",
    "rope_frequencies", "axial_frequencies", "rotate", "rotation_matrix", "rotation_angles",
    "rotary_tables", "apply_rotary",
]
