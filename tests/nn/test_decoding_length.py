"""generate past the training length: one warning per training length naming it and YaRN, none
within it or under a context extension (rove_jax.nn.decoding)."""

import warnings

import jax
import pytest
from flax import nnx

from rove_jax import scaling
from rove_jax.nn import decoding
from rove_jax.nn.model import GPT, GPTConfig


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
  monkeypatch.setattr(decoding, "_WARNED_PAST", set())


def model(**kw):
  cfg = GPTConfig(**{**dict(vocab_size=64, n_layer=1, n_head=2, d_model=16, max_len=16), **kw})
  return GPT(cfg, rngs=nnx.Rngs(0))


def run(m, prompt_len, new, **kw):
  prompt = jax.numpy.zeros((1, prompt_len), jax.numpy.int32)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = decoding.generate(m, prompt, new, temperature=0.0, **kw)
  assert out.shape == (1, prompt_len + new)
  return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_a_prompt_past_the_training_length_warns_once_naming_it_and_yarn():
  m = model()
  (message,) = run(m, 40, 4)
  assert message == (
    "generate: a prompt of 40 tokens and max_new_tokens=4 reach position 44, past the "
    "training length max_len=16; the model never saw those positions and its text there is "
    "usually worse; YaRN may help: rope_scaling=RopeScaling(rope_type='yarn', factor=3.0, "
    "original_max_position_embeddings=16) (said once)"
  )
  assert run(m, 40, 4) == []  # once


def test_no_warning_within_the_training_length_or_with_yarn():
  m = model()
  assert run(m, 12, 4) == []
  yarn = scaling.RopeScaling(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)
  assert run(m, 40, 4, rope_scaling=yarn) == []
  assert run(model(rope_scaling=yarn.to_dict()), 40, 4) == []


def test_encodings_without_rotary_frequencies_get_no_yarn_hint():
  (message,) = run(model(pos_encoding="nope"), 20, 2)
  assert "past the training length max_len=16" in message and "YaRN" not in message
