"""Perplexity (rove_jax.evaluation.perplexity) against a float64 numpy reference on the shared
trained run: which tokens each window scores, token weighting, the per-batch padding, position
buckets, per-window records, YaRN past the training length and YaRN at one fixed factor.

The reference walks the token stream window by window in plain Python; only the logits come
from the model, called directly with its default attention kernel (not through the scorer,
its batching, padding or chunked kernel).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rove_jax.evaluation import perplexity, scoring
from rove_jax.nn import model as nn_model
from rove_jax.scaling import RopeScaling

TRAIN_LEN = 64  # the shared run's max_len = data.seq_len


def reference_model(run):
  """The run's GPT as a jitted (inputs [B, L], rope_scaling) -> logits [B, L, V] (the default
  attention kernel, not the scorer's chunked one)."""
  graphdef = nn_model.graphdef(run.model_config)

  @functools.partial(jax.jit, static_argnames="yarn")
  def logits(params, inputs_BL, yarn=None):
    return nnx.merge(graphdef, params)(inputs_BL, rope_scaling=yarn)

  def call(inputs_BL, yarn=None):
    return logits(run.params, inputs_BL, yarn=yarn)

  call.vocab_size = run.model_config.vocab_size
  return call


def reference_ppl(
  model,
  tokens,
  length,
  *,
  max_tokens,
  stride=None,
  yarn_train_len=None,
  yarn_factor=None,
  n_buckets=8,
):
  """Token-weighted mean NLL of `length`-token windows, computed window by window.

  Window starts advance by `stride` (default: `length`, non-overlapping windows sharing one
  token); the first window scores all its `length` targets, each later one only its last
  `stride` (the tokens no earlier window scored). Windows are taken until at least
  `max_tokens` targets are scored. `yarn_train_len`: YaRN with factor length / it when
  length exceeds it, or with `yarn_factor` at any length when that is given.

  Returns:
    {"loss", "tokens", "windows", "by_position", "window_nll", "window_tokens"} like one row of
    perplexity.evaluate (the window sums unrounded).
  """
  tokens = np.asarray(tokens, np.int64)
  stride = length if stride is None else stride
  starts, firsts, n_targets = [], [], 0
  start = 0
  while start + length + 1 <= tokens.size and n_targets < max_tokens:
    first = 0 if start == 0 else length - stride
    starts.append(start)
    firsts.append(first)
    n_targets += length - first
    start += stride
  yarn = None
  if yarn_train_len is not None and (yarn_factor or length > yarn_train_len):
    yarn = RopeScaling(
      rope_type="yarn",
      factor=yarn_factor or length / yarn_train_len,
      original_max_position_embeddings=yarn_train_len,
    )
  inputs = np.stack([tokens[s : s + length] for s in starts]).astype(np.int32)
  logits = np.asarray(model(jnp.asarray(inputs), yarn), np.float64)
  chex.assert_shape(logits, (len(starts), length, model.vocab_size))
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  total, count = 0.0, 0
  bucket_sum, bucket_cnt = np.zeros(n_buckets), np.zeros(n_buckets)
  window_nll, window_tokens = [], []
  for i, (s, first) in enumerate(zip(starts, firsts)):
    window_nll.append(0.0)
    window_tokens.append(length - first)
    for p in range(first, length):
      nll = -logp[i, p, tokens[s + p + 1]]
      total += nll
      count += 1
      window_nll[-1] += nll
      b = min(p * n_buckets // length, n_buckets - 1)
      bucket_sum[b] += nll
      bucket_cnt[b] += 1
  return {
    "loss": total / count,
    "tokens": count,
    "windows": len(starts),
    "by_position": [s / c if c else None for s, c in zip(bucket_sum, bucket_cnt)],
    "window_nll": window_nll,
    "window_tokens": window_tokens,
  }


def assert_row_matches(got, want, where):
  """A perplexity row against `reference_ppl`: aggregates, buckets and per-window records
  (one a window, 6 significant digits, summing to the loss)."""
  assert got["tokens"] == want["tokens"], where
  assert got["windows"] == want["windows"], where
  assert got["window_tokens"] == want["window_tokens"], where
  np.testing.assert_allclose(got["window_nll"], want["window_nll"], rtol=5e-6, err_msg=str(where))
  np.testing.assert_allclose(
    sum(got["window_nll"]) / sum(got["window_tokens"]), got["loss"], rtol=1e-6, err_msg=str(where)
  )
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6, err_msg=str(where))
  np.testing.assert_allclose(got["ppl"], np.exp(want["loss"]), rtol=1e-6, err_msg=str(where))
  assert [b is None for b in got["by_position"]] == [b is None for b in want["by_position"]]
  chex.assert_trees_all_close(
    [b for b in got["by_position"] if b is not None],
    [b for b in want["by_position"] if b is not None],
    rtol=1e-6,
  )


@pytest.fixture(scope="module")
def run(trained_run):
  return scoring.load_run(str(trained_run))


@pytest.fixture(scope="module")
def text_tokens():
  """A held-out-like byte stream: code-ish words (the run was trained on Python source)."""
  rng = np.random.default_rng(7)
  words = ["def", "return", "self", "import", "for", "in", "if", "else:", "(x)", "=", "\n    "]
  text = " ".join(rng.choice(words, size=600))
  return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


@pytest.mark.parametrize("stride_fraction", [None, 0.25])
def test_perplexity_matches_a_numpy_reference_with_and_without_yarn(
  run, text_tokens, stride_fraction
):
  assert scoring.Scorer(run).yarn_scaling(TRAIN_LEN) is None  # the run is what we think it is
  # Small batches: several per length and a padded last one, whose rows must not count.
  scorer = scoring.Scorer(run, chunk_size=16, max_tokens_per_batch=200)
  lengths, max_tokens = [TRAIN_LEN, 2 * TRAIN_LEN], 300
  yarn = "all" if stride_fraction is None else "both"  # yarn_fixed once: it costs compiles
  out = perplexity.evaluate(
    scorer,
    text_tokens,
    lengths,
    yarn=yarn,
    max_tokens=max_tokens,
    stride_fraction=stride_fraction,
    progress=False,
  )
  assert out["protocol"]["mode"] == ("sliding" if stride_fraction else "non-overlapping")
  assert set(out) == {"protocol", *perplexity.YARN_SETTINGS[yarn]}
  model = reference_model(run)
  for L in lengths:
    stride = None if stride_fraction is None else int(L * stride_fraction)
    plain = reference_ppl(model, text_tokens, L, max_tokens=max_tokens, stride=stride)
    yarn = reference_ppl(
      model, text_tokens, L, max_tokens=max_tokens, stride=stride, yarn_train_len=TRAIN_LEN
    )
    assert_row_matches(out["none"][str(L)], plain, ("none", L))
    assert_row_matches(out["yarn"][str(L)], yarn, ("yarn", L))
    if L <= TRAIN_LEN:  # YaRN is the identity up to the training length
      assert out["yarn"][str(L)]["loss"] == out["none"][str(L)]["loss"]
    else:  # and changes the numbers past it (~1e-4 here, 100x the tolerance above)
      assert abs(yarn["loss"] / plain["loss"] - 1) > 2e-5, (yarn, plain)
  if yarn == "all":  # one factor, max(lengths) / TRAIN_LEN = 2, at both lengths
    assert out["protocol"]["yarn_fixed_factor"] == 2.0
    fixed_1x = reference_ppl(
      model,
      text_tokens,
      TRAIN_LEN,
      max_tokens=max_tokens,
      yarn_train_len=TRAIN_LEN,
      yarn_factor=2.0,
    )
    assert_row_matches(out["yarn_fixed"][str(TRAIN_LEN)], fixed_1x, ("yarn_fixed", TRAIN_LEN))
    assert abs(fixed_1x["loss"] / out["none"][str(TRAIN_LEN)]["loss"] - 1) > 2e-5  # not none
    assert out["yarn_fixed"][str(2 * TRAIN_LEN)] == out["yarn"][str(2 * TRAIN_LEN)]


@pytest.mark.parametrize("stride", [1, 8, 32])
def test_sliding_windows_score_each_token_once_with_the_most_context(text_tokens, stride):
  """Window i starts at i * stride; its scored targets follow the previous window's, so every
  stream position is a target once, in order, and every target after the first window sees
  at least L - stride + 1 tokens (itself predicted from them)."""
  L, max_tokens = 32, 160
  wins, first = perplexity.windows(text_tokens, L, stride=stride, max_targets=max_tokens)
  chex.assert_shape(wins, (first.size, L + 1))
  targets, context = [], []
  for i, (w, f) in enumerate(zip(wins, first)):
    np.testing.assert_array_equal(w, text_tokens[i * stride : i * stride + L + 1])
    targets += [i * stride + 1 + p for p in range(f, L)]
    context += list(range(f + 1, L + 1))
  assert targets == list(range(1, len(targets) + 1))
  assert max_tokens <= len(targets) < max_tokens + L  # the cap, reached by the last window
  assert min(context[L:]) == L - stride + 1
