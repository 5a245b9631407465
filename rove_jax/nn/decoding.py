"""Decoding with a GPT's KV cache: `generate` (a jitted prefill, then a lax.scan of one-token
steps) and `sample_logits`.

Shape letters (legend in rove_jax): B batch, T prompt tokens, V vocabulary.
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from rove_jax import scaling


def sample_logits(
  logits_BV, key, *, temperature: float, top_k: Optional[int], valid_vocab: Optional[int] = None
):
  """Greedy when temperature == 0, else softmax(logits / temperature) restricted to top_k.
  Ids >= valid_vocab (padding of the embedding table) are never chosen."""
  if valid_vocab is not None and valid_vocab < logits_BV.shape[-1]:
    ids = jnp.arange(logits_BV.shape[-1])[None]
    logits_BV = jnp.where(ids < valid_vocab, logits_BV, -jnp.inf)
  if temperature == 0:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  logits_BV = logits_BV.astype(jnp.float32) / temperature
  if top_k is not None:
    kth = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
  return jax.random.categorical(key, logits_BV, axis=-1).astype(jnp.int32)


@functools.lru_cache(maxsize=16)
def _generate_fn(graphdef, max_new_tokens, temperature, top_k, valid_vocab, rope_scaling):
  # Every argument is part of the cache key: rope_scaling is None or a (hashable) RopeScaling.

  @jax.jit
  def run(state, prompt_BT, cache, rng):
    model = nnx.merge(graphdef, state)
    logits, cache = model(prompt_BT, cache=cache, rope_scaling=rope_scaling)
    keys = jax.random.split(rng, max_new_tokens)
    sample = functools.partial(
      sample_logits, temperature=temperature, top_k=top_k, valid_vocab=valid_vocab
    )
    first = sample(logits[:, -1], keys[0])

    def step(carry, key):
      token_B, cache = carry
      logits, cache = model(token_B[:, None], cache=cache, rope_scaling=rope_scaling)
      nxt = sample(logits[:, -1], key)
      return (nxt, cache), token_B

    (last, _), emitted = jax.lax.scan(step, (first, cache), keys[1:])
    return jnp.concatenate([emitted.T, last[:, None]], axis=1)

  return run


_WARNED_PAST: set = set()  # training lengths already warned about in this process


def warn_past_training_length(
  cfg, prompt_len: int, max_new_tokens: int, rope_scaling: Optional[scaling.RopeScaling]
) -> bool:
  """Warns once per training length (a UserWarning) when prompt and new tokens reach past
  cfg.max_len under no context extension (rope_scaling None or "default", the call's or else
  the config's): the model never saw those positions. Returns whether it warned."""
  end = prompt_len + max_new_tokens
  scaled = rope_scaling if rope_scaling is not None else cfg.rope_scaling
  if end <= cfg.max_len or (scaled is not None and scaled.rope_type != "default"):
    return False
  if cfg.max_len in _WARNED_PAST:
    return False
  _WARNED_PAST.add(cfg.max_len)
  hint = (
    f"; YaRN may help: rope_scaling=RopeScaling(rope_type='yarn', "
    f"factor={-(-end // cfg.max_len)}.0, original_max_position_embeddings={cfg.max_len})"
    if cfg.pos_encoding in ("rove", "rope")
    else ""
  )
  warnings.warn(
    f"generate: a prompt of {prompt_len} tokens and max_new_tokens={max_new_tokens} "
    f"reach position {end}, past the training length max_len={cfg.max_len}; the "
    f"model never saw those positions and its text there is usually worse{hint} "
    f"(said once)",
    UserWarning,
    stacklevel=3,
  )
  return True


def generate(
  model,
  prompt,
  max_new_tokens: int,
  *,
  temperature: float = 1.0,
  top_k: Optional[int] = None,
  rng=None,
  valid_vocab: Optional[int] = None,
  rope_scaling: Optional[scaling.RopeScaling] = None,
):
  """Prompt [B, T] -> [B, T + max_new_tokens]: a jitted prefill, then a lax.scan of one-token
  decoding steps against the KV cache.

  temperature 0 is greedy (deterministic); top_k restricts sampling to the k likeliest tokens;
  valid_vocab excludes the padded ids a tokenizer never produces (e.g. 257 for bytes);
  rope_scaling overrides the config's as in the model call (None keeps it).
  """
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f"prompt must be [B, T] with T >= 1, got shape {prompt.shape}")
  if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
    raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}")
  if top_k is not None and not 1 <= top_k <= model.config.vocab_size:
    raise ValueError(f"top_k must be in [1, vocab_size={model.config.vocab_size}], got {top_k}")
  if temperature > 0 and rng is None:
    raise ValueError("sampling (temperature > 0) needs rng=jax.random.key(...)")
  B, T = prompt.shape
  rope_scaling = scaling.RopeScaling.coerce(rope_scaling)  # hashable; a bad value: ValueError
  warn_past_training_length(model.config, T, max_new_tokens, rope_scaling)
  cache = model.init_cache(B, T + max_new_tokens)
  graphdef, state = nnx.split(model)
  fn = _generate_fn(graphdef, max_new_tokens, float(temperature), top_k, valid_vocab, rope_scaling)
  rng = jax.random.key(0) if rng is None else rng
  return jnp.concatenate([prompt, fn(state, prompt, cache, rng)], axis=1)
