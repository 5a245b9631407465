"""The model layer: GPTConfig, the Flax NNX GPT, decoding, baselines, Linen, Figure 1, and weight
files (transformers GPT-2 checkpoints, exports for inference)."""

from rove_jax import extras

extras.require("nn", "rove_jax.nn")
