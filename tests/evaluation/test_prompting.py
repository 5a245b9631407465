"""The task code RULER and ICL share: fitting to a length (against brute force, at the exact
boundary), the tolerance window, encoding, JSON reading and answer scoring."""

import math

import chex
import numpy as np
import pytest

from rove_jax.evaluation import prompting
from tests.reference import ByteTok, WordTok


def largest_fitting(size, target, lo, hi):
  """Brute force: the largest n in [lo, hi) with size(n) <= target."""
  return max(n for n in range(lo, hi) if size(n) <= target)


def counting(size):
  calls = []

  def f(n):
    calls.append(n)
    return size(n)

  return f, calls


# ------------------------------------------------------------------------------- fit_length


@pytest.mark.parametrize("lo", [0, 1, 5])
def test_fit_length_is_the_largest_fitting_n(lo):
  # Nonlinear and with plateaus (size(n) == size(n + 1) in places), so interpolation alone
  # would miss and the largest n of a plateau must be found.
  size = lambda n: 7 + 3 * n + int(5 * math.sqrt(n)) - (n % 4 == 1)
  for target in range(size(lo), 2500, 13):
    f, calls = counting(size)
    fit = prompting.fit_length(f, target, lo=lo)
    assert fit.n == largest_fitting(size, target, lo, 2000), target
    assert fit.tokens == size(fit.n) <= target < size(fit.n + 1) == fit.next_tokens
    assert len(calls) == len(set(calls))  # each n measured once


def test_fit_length_keeps_an_exact_hit():
  # The target equals size(k): k fits (<=, not <), and k + 1 does not.
  size = lambda n: 10 + 2 * n
  for k in (0, 1, 2, 17, 100, 1000):
    fit = prompting.fit_length(size, size(k), lo=0)
    assert (fit.n, fit.tokens, fit.next_tokens) == (k, size(k), size(k + 1))
    assert prompting.fit_length(size, size(k) + 1, lo=0).n == k  # one short of the next unit
    if k:
      assert prompting.fit_length(size, size(k) - 1, lo=0).n == k - 1


def test_fit_length_material_runs_out():
  size = lambda n: 4 * n if n <= 30 else math.inf
  fit = prompting.fit_length(size, 1000, lo=0)
  assert (fit.n, fit.tokens, fit.next_tokens) == (30, 120, math.inf)


def test_fit_length_with_a_given_upper_end_never_measures_it():
  size = lambda c: 100 + c if c < 9 else pytest.fail("hi was measured")
  f, calls = counting(size)
  fit = prompting.fit_length(f, 104, lo=0, hi=9)
  assert (fit.n, fit.tokens) == (4, 104) and 9 not in calls
  # Everything below hi fits: n is hi - 1 and the size above it is unknown (inf).
  fit = prompting.fit_length(size, 1000, lo=0, hi=9)
  assert (fit.n, fit.tokens, fit.next_tokens) == (8, 108, math.inf)
  assert prompting.fit_length(size, 1000, lo=3, hi=4).n == 3


def test_fit_length_errors():
  with pytest.raises(prompting.LengthError, match="shortest example has 12 tokens.*at least 12"):
    prompting.fit_length(lambda n: 12 + n, 11, lo=0)
  with pytest.raises(prompting.LengthError, match="cannot reach 50 tokens"):
    prompting.fit_length(lambda n: 3, 50, lo=0)  # a tokenizer that encodes nothing


@pytest.mark.parametrize("tok", [ByteTok(), WordTok()], ids=["bytes", "words"])
def test_fitting_filler_text_to_a_length(tok):
  words = " ".join(prompting.NOISE_SENTENCES * 200).split()

  def size(n):
    return prompting.count_tokens(tok, " ".join(words[:n]), " 42")

  for target, tolerance in ((64, 0.05), (300, 0.05), (1000, 0.02), (1500, 0.02)):
    fit = prompting.fit_length(size, target, lo=0)
    assert fit.n == largest_fitting(size, target, 0, fit.n + 40)
    assert prompting.within_tolerance(fit.tokens, target, tolerance), (target, fit)
    assert fit.tokens == 1 + len(tok.encode(" ".join(words[: fit.n]))) + len(tok.encode(" 42"))


# ------------------------------------------------------------------------------- tolerance


def test_within_tolerance_window_edges():
  assert prompting.within_tolerance(1000, 1000, 0.02)
  assert prompting.within_tolerance(980, 1000, 0.02)
  assert not prompting.within_tolerance(979, 1000, 0.02)
  assert not prompting.within_tolerance(1001, 1000, 0.02)  # never past the target
  assert prompting.within_tolerance(244, 256, 0.05) and not prompting.within_tolerance(
    243, 256, 0.05
  )


def test_within_tolerance_matches_the_fraction_of_the_target():
  # Against the other way to write it, (1 - tolerance) * target <= tokens, in float64.
  targets = np.arange(1, 20001)
  for tolerance in (0.02, 0.05):
    floor = np.floor((1 - tolerance) * targets).astype(int)
    for tokens in (floor - 1, floor, floor + 1, targets, targets + 1):
      expected = (tokens >= (1 - tolerance) * targets) & (tokens <= targets)
      got = [prompting.within_tolerance(int(n), int(t), tolerance) for n, t in zip(tokens, targets)]
      chex.assert_trees_all_equal(np.array(got), expected)


# ------------------------------------------------------------------------------- encoding


def test_encoding():
  tok = ByteTok()
  ids = prompting.encode(tok, "héllo")
  chex.assert_shape(ids, (6,))
  chex.assert_type(ids, np.int32)
  chex.assert_trees_all_equal(ids, np.array(list("héllo".encode()), np.int32))
  prompt = prompting.encode_prompt(tok, "ab")
  chex.assert_trees_all_equal(prompt, np.array([256, 97, 98], np.int32))
  chex.assert_shape(prompting.encode_prompt(tok, ""), (1,))
  assert prompting.count_tokens(tok, "ab", " c") == 1 + 2 + 2
  assert prompting.count_tokens(WordTok(), "one two", " three") == 1 + 3 + 2

  class Flat2D(ByteTok):
    def encode(self, text):
      return super().encode(text)[None]

  with pytest.raises(ValueError, match="1-D id array, got shape"):
    prompting.encode(Flat2D(), "ab")


def test_checks_and_filler():
  prompting.check_int("seed", np.int64(3), 0)
  for bad in (-1, True, 2.0, "3"):
    with pytest.raises(ValueError, match=r"seed must be an int >= 0, got seed="):
      prompting.check_int("seed", bad, 0)
  with pytest.raises(ValueError, match=r"tokenizer lacks \['decode', 'eot_id'\]"):
    prompting.check_tokenizer(type("T", (), {"encode": None})())
  # The passkey filler and RULER's noise haystack: five sentences, each ending a sentence.
  assert len(prompting.NOISE_SENTENCES) == 5
  assert all(s.endswith(".") for s in prompting.NOISE_SENTENCES)


def test_read_json(tmp_path):
  good, bad = tmp_path / "good.json", tmp_path / "bad.json"
  good.write_text('{"a": [1, 2]}')
  bad.write_text('{"a": [1,\n 2,, 3]}')
  assert prompting.read_json(good) == {"a": [1, 2]}
  with pytest.raises(ValueError, match=r"bad.json, line 2: invalid JSON"):
    prompting.read_json(bad)


# ------------------------------------------------------------------------------- scoring


def test_score_pairs_and_means_on_hand_numbers():
  prompts = [np.array([1, 2], np.int32), np.array([3], np.int32), np.array([4, 5, 6], np.int32)]
  answers = [np.array([7], np.int32)] * 3
  seen = []

  def score_fn(p, a):
    seen.append((p, a))
    return [(np.float32(0.5), np.bool_(True)), (2, 0), (3.5, 1)]

  results = prompting.score_pairs(score_fn, prompts, answers)
  assert results == [(0.5, True), (2.0, False), (3.5, True)]
  assert all(type(n) is float and type(m) is bool for n, m in results)
  assert len(seen) == 1  # one call for all pairs, in order
  chex.assert_trees_all_equal(seen[0], (prompts, answers))
  nll, exact = prompting.mean_scores(results)
  assert nll == pytest.approx(2.0) and exact == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="returned 2 results for 3 pairs of task 'x'; it must"):
    prompting.score_pairs(lambda p, a: [(0.0, True)] * 2, prompts, answers, " of task 'x'")


def test_sample_records_round_to_six_digits_in_order():
  records = prompting.sample_records([(1 / 3, True), (123456.78, False), (2.0, True)])
  assert records == {"sample_nll": [0.333333, 123457.0, 2.0], "sample_correct": [1, 0, 1]}
  assert prompting.round_sig(-0.000123456789) == -0.000123457


def test_context_fit_cuts_prompts_from_the_left_and_counts_them():
  seen = []

  def score_fn(prompts, answers):
    seen.append([p.tolist() for p in prompts])
    return [(float(len(p)), True) for p in prompts]

  fit = prompting.ContextFit(score_fn, 6)
  answers = [np.array([9, 9], np.int32)] * 3
  prompts = [
    np.arange(4, dtype=np.int32),
    np.arange(5, dtype=np.int32),
    np.arange(10, dtype=np.int32),
  ]
  assert fit(prompts, answers) == [(4.0, True), (4.0, True), (4.0, True)]
  # The one that fit is untouched; the others keep their last tokens (the question).
  assert seen == [[[0, 1, 2, 3], [1, 2, 3, 4], [6, 7, 8, 9]]]
  assert (fit.prompts, fit.truncated) == (3, 2)
  fit(prompts[:1], answers[:1])
  assert (fit.prompts, fit.truncated) == (4, 2)  # counts add up over calls
  with pytest.raises(
    ValueError, match="an answer of 6 tokens leaves no room for a prompt in a context of 6 tokens"
  ):
    fit(prompts[:1], [np.arange(6, dtype=np.int32)])
