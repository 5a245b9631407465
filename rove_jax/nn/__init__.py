"""The model layer: GPTConfig, the Flax NNX GPT, decoding, baselines, Linen, Figure 1."""

from rove_jax import extras

extras.require('nn', 'rove_jax.nn')
