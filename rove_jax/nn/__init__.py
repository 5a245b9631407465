"""The model layer: GPTConfig, the Flax NNX GPT, decoding, baselines, Linen, Figure 1."""
