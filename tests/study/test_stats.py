"""stats: the paired hierarchical bootstrap covers a known difference at about its nominal
rate, pairing narrows the interval, the weighted statistic is the ratio estimator, and the
verdicts and input errors are what the docstrings say."""

import math

import numpy as np
import pytest

from study import stats


def simulate(rng, *, n_seeds=3, n_units=40, delta=0.3, unit_sd=2.0, seed_sd=0.22, noise_sd=1.0):
  """Scores of A and B runs: a per-unit difficulty shared by every run, a per-run (seed)
  offset and per-(run, unit) noise; the true difference of the encodings' means is delta."""
  difficulty = unit_sd * rng.normal(size=n_units)

  def runs(shift):
    return [
      shift + difficulty + seed_sd * rng.normal() + noise_sd * rng.normal(size=n_units)
      for _ in range(n_seeds)
    ]

  return runs(delta), runs(0.0)


def coverage(statistic, n_sets=200, delta=0.3, first_seed=1234):
  """How often the 95 % interval of statistic(a_runs, b_runs, seed) covers delta, the true
  difference of the encodings' means and A's true mean, over simulated data sets."""
  rng = np.random.default_rng(first_seed)
  hits = 0
  for k in range(n_sets):
    res = statistic(*simulate(rng, delta=delta), k)
    assert res.lower <= res.estimate <= res.upper
    hits += res.lower <= delta <= res.upper
  return hits / n_sets


# Measured over 1000 other data sets: 0.952 (difference) and 0.93-0.95 (mean); the bounds below
# are 1.8 binomial sd (0.017 at 200 sets) or more from those, and the RNG seeds are fixed.


def test_the_difference_interval_covers_the_true_difference_at_about_95_percent():
  cover = coverage(lambda a, b, k: stats.paired_difference(a, b, n_boot=300, seed=k))
  assert 0.90 <= cover <= 0.99


def test_the_mean_interval_covers_the_true_mean_at_about_95_percent():
  cover = coverage(lambda a, b, k: stats.mean_interval(a, n_boot=300, seed=k))
  assert 0.90 <= cover <= 0.99


def test_pairing_removes_the_shared_unit_difficulty_from_the_interval():
  a, b = simulate(np.random.default_rng(0), n_units=200, unit_sd=5.0, seed_sd=0.02, noise_sd=0.5)
  paired = stats.paired_difference(a, b, n_boot=500)
  unpaired = stats.paired_difference(a, b, n_boot=500, paired=False)
  assert paired.estimate == unpaired.estimate
  # Widths ~ sqrt(2 * 0.5^2 / 600) vs sqrt(2 * 5^2 / 200): about eleven times narrower.
  assert paired.upper - paired.lower < 0.2 * (unpaired.upper - unpaired.lower)
  assert paired.direction == "A higher" and unpaired.direction == "inconclusive"
  assert paired.paired and not unpaired.paired


def test_weighted_runs_use_the_ratio_estimator_and_exp_gives_the_perplexity_ratio():
  tokens = np.array([100, 10, 50, 1])
  nll_a = [np.array([250.0, 40.0, 120.0, 9.0]), np.array([240.0, 45.0, 110.0, 8.0])]
  nll_b = [np.array([300.0, 30.0, 150.0, 2.0])]
  loss_a = [float(x.sum() / tokens.sum()) for x in nll_a]
  loss_b = float(nll_b[0].sum() / tokens.sum())
  assert loss_a[0] != pytest.approx(np.mean(nll_a[0] / tokens))  # not the mean of windows
  iv = stats.mean_interval(nll_a[:1], weights=tokens, n_boot=200)
  assert iv.estimate == pytest.approx(loss_a[0], rel=1e-12)
  assert iv.transformed(math.exp).estimate == pytest.approx(math.exp(loss_a[0]))
  assert not iv.seed_spread_included and iv.n_seeds == 1 and iv.n_units == 4
  res = stats.paired_difference(nll_a, nll_b, weights=tokens, contrast="exp", n_boot=200)
  assert res.a == pytest.approx(np.mean(loss_a)) and res.b == pytest.approx(loss_b)
  assert res.estimate == pytest.approx(math.exp(np.mean(loss_a) - loss_b) - 1)
  assert not res.seed_spread_included  # B has one seed
  assert (res.n_seeds_a, res.n_seeds_b, res.n_units, res.n_boot) == (2, 1, 4, 200)
  per_run = stats.paired_difference(
    nll_a, nll_b, weights=([tokens, tokens], [tokens]), contrast="exp", n_boot=200
  )
  assert (per_run.estimate, per_run.lower, per_run.upper) == (res.estimate, res.lower, res.upper)
  rel = stats.paired_difference(nll_a, nll_b, weights=tokens, contrast="relative", n_boot=50)
  assert rel.estimate == pytest.approx(np.mean(loss_a) / loss_b - 1)


def test_results_are_reproducible_for_a_seed():
  a, b = simulate(np.random.default_rng(5))
  first, again = (stats.paired_difference(a, b, n_boot=100, seed=3) for _ in range(2))
  assert first == again
  other = stats.paired_difference(a, b, n_boot=100, seed=4)
  assert (other.lower, other.upper) != (first.lower, first.upper)


def test_directions_and_verdicts():
  def result(lower, upper):
    return stats.Comparison(
      estimate=(lower + upper) / 2,
      lower=lower,
      upper=upper,
      a=0.0,
      b=0.0,
      contrast="difference",
      ci=0.95,
      n_seeds_a=3,
      n_seeds_b=3,
      n_units=10,
      n_boot=100,
      paired=True,
      seed_spread_included=True,
    )

  lower, higher, straddles = result(-0.3, -0.1), result(0.1, 0.3), result(-0.1, 0.2)
  assert [r.direction for r in (lower, higher, straddles)] == [
    "A lower",
    "A higher",
    "inconclusive",
  ]
  assert [stats.verdict(r) for r in (lower, higher, straddles)] == [
    "supports",
    "contradicts",
    "inconclusive",
  ]
  assert [stats.verdict(r, claim="higher") for r in (lower, higher, straddles)] == [
    "contradicts",
    "supports",
    "inconclusive",
  ]
  with pytest.raises(ValueError, match="claim must be one of"):
    stats.verdict(lower, claim="better")
  # End to end: A's accuracy (0/1 per sample) clearly above B's on the same samples.
  a = [np.ones(50)] * 3
  b = [np.r_[np.ones(25), np.zeros(25)]] * 3
  assert stats.verdict(stats.paired_difference(a, b, n_boot=200), claim="higher") == "supports"


def test_one_unit_and_one_run_give_a_point_interval_flagged_as_lacking_seed_spread():
  res = stats.paired_difference([[2.0]], [[1.5]], n_boot=20)
  assert (res.estimate, res.lower, res.upper) == (0.5, 0.5, 0.5)
  assert not res.seed_spread_included and res.direction == "A higher"


@pytest.mark.parametrize(
  "call, says",
  [
    (
      lambda: stats.paired_difference([np.ones(3), np.ones(4)], [np.ones(3)]),
      "run 1 has 4 units, run 0 has 3",
    ),
    (lambda: stats.paired_difference([np.ones(3)], [np.ones(4)]), "a_runs have 3 units, b_runs 4"),
    (lambda: stats.paired_difference([], [np.ones(3)]), "a_runs: no runs"),
    (lambda: stats.mean_interval([np.ones(0)]), r"runs\[0\]: no units"),
    (lambda: stats.mean_interval(np.ones(3)), "wrap a single run"),
    (lambda: stats.mean_interval([np.ones((2, 2))]), "must be 1-D"),
    (lambda: stats.mean_interval([[1.0, np.nan]]), "must be finite"),
    (lambda: stats.mean_interval([np.ones(3)], ci=1.0), "ci must lie strictly between 0 and 1"),
    (lambda: stats.mean_interval([np.ones(3)], ci=0), "ci must lie strictly between 0 and 1"),
    (lambda: stats.paired_difference([np.ones(3)], [np.ones(3)], ci=95), "ci must lie"),
    (lambda: stats.mean_interval([np.ones(3)], n_boot=0), "n_boot must be a positive"),
    (lambda: stats.mean_interval([np.ones(3)], weights=np.ones(2)), r"weights must have shape"),
    (lambda: stats.mean_interval([np.ones(3)], weights=-np.ones(3)), "non-negative"),
    (
      lambda: stats.mean_interval([np.ones(3)] * 2, weights=[[1, 1, 1], [1, 1]]),
      "rows of different lengths",
    ),
    (
      lambda: stats.paired_difference([np.ones(3)], [np.ones(3)], contrast="ratio"),
      "contrast must be one of",
    ),
  ],
)
def test_bad_inputs_raise_a_clear_value_error(call, says):
  with pytest.raises(ValueError, match=says):
    call()


# ------------------------------------------------------------- seed pairs, strata, p, MC error


def simulate_pairs(rng, *, n_seeds=8, n_units=40, delta=0.3, shared_sd=0.5, inter_sd=0.22):
  """Runs whose seed effect is mostly shared by the two encodings (seed i: the same
  initialisation and batch order), plus an encoding-by-seed part inter_sd."""
  difficulty, shared = 2.0 * rng.normal(size=n_units), shared_sd * rng.normal(size=n_seeds)

  def runs(shift):
    return [
      shift + difficulty + shared[i] + inter_sd * rng.normal() + rng.normal(size=n_units)
      for i in range(n_seeds)
    ]

  return runs(delta), runs(0.0)


def test_paired_seeds_cover_the_true_difference_and_cancel_the_shared_seed_effect():
  # Measured over 400 data sets (3 / 8 pairs): 94.8 / 97.0 % at inter_sd 0.22.
  rng = np.random.default_rng(7)
  hits = 0
  for k in range(150):
    a, b = simulate_pairs(rng)
    res = stats.paired_difference(a, b, n_boot=300, seed=k, pair_seeds=True)
    hits += res.lower <= 0.3 <= res.upper
    assert res.seeds_paired and len(res.seed_diffs) == 8
  assert 0.90 <= hits / 150 <= 1.0
  # The shared seed effect dominates: resampling each encoding's seeds on its own counts it
  # twice, pairing cancels it.
  a, b = simulate_pairs(np.random.default_rng(1), n_units=400, shared_sd=2.0, inter_sd=0.05)
  paired = stats.paired_difference(a, b, n_boot=2000, pair_seeds=True)
  unpaired = stats.paired_difference(a, b, n_boot=2000)
  assert paired.estimate == unpaired.estimate
  assert paired.upper - paired.lower < 0.3 * (unpaired.upper - unpaired.lower)
  assert paired.seed_diffs == pytest.approx([np.mean(x - y) for x, y in zip(a, b)])
  with pytest.raises(ValueError, match="pair_seeds needs as many runs of A as of B"):
    stats.paired_difference(a, b[:3], pair_seeds=True)


def test_strata_keep_every_cell_in_every_replicate():
  # Two cells with very different means and no noise inside a cell: resampled within the
  # cells, every replicate has the full-data mean; resampled across them it does not.
  scores = [np.r_[np.zeros(20), np.full(5, 10.0)]]
  strata = [0] * 20 + [1] * 5
  within = stats.mean_interval(scores, strata=strata, n_boot=500)
  assert within.lower == pytest.approx(2.0) and within.upper == pytest.approx(2.0)
  assert within.n_strata == 2
  across = stats.mean_interval(scores, n_boot=500)
  assert across.upper - across.lower > 2.0 and across.n_strata == 1
  # the same in a comparison, where A and B share the unit draws
  res = stats.paired_difference(
    scores, [np.r_[np.ones(20), np.full(5, 6.0)]], strata=strata, n_boot=500
  )
  assert (res.lower, res.upper) == pytest.approx((2.0 - 2.0, 2.0 - 2.0))
  with pytest.raises(ValueError, match="strata must give one label per unit"):
    stats.mean_interval(scores, strata=[0, 1])


def test_p_value_agrees_with_the_interval_and_mc_error_falls_with_replicates():
  a, b = simulate(np.random.default_rng(3), delta=0.6, seed_sd=0.05)
  res = stats.paired_difference(a, b, n_boot=4000, seed=1)
  assert res.direction == "A higher" and res.p_value < 0.05
  a0, b0 = simulate(np.random.default_rng(3), delta=0.0, seed_sd=0.05)
  null = stats.paired_difference(a0, b0, n_boot=4000, seed=1)
  assert (null.direction == "inconclusive") == (null.p_value >= 0.05)
  assert res.p_value >= 2 / 4001  # never exactly 0
  few, many = (stats.paired_difference(a, b, n_boot=n, seed=2).mc_se for n in (2000, 32000))
  assert all(0 < m < f for f, m in zip(few, many))
  assert 2 < np.mean(few) / np.mean(many) < 8  # ~ sqrt(16) = 4
  assert stats.paired_difference(a, b, n_boot=100).mc_se is None  # too few to say


def test_an_endpoint_within_two_monte_carlo_errors_of_zero_is_flagged():
  def result(lower, upper, se):
    return stats.Comparison(
      estimate=(lower + upper) / 2,
      lower=lower,
      upper=upper,
      a=0.0,
      b=0.0,
      contrast="difference",
      ci=0.95,
      n_seeds_a=8,
      n_seeds_b=8,
      n_units=10,
      n_boot=10000,
      paired=True,
      seed_spread_included=True,
      mc_se=None if se is None else (se, se),
    )

  assert result(0.01, 0.5, 0.004).mc_stable
  assert not result(0.007, 0.5, 0.004).mc_stable  # "supports" by less than 2 errors
  assert not result(-0.5, 0.005, 0.004).mc_stable  # "inconclusive" by less than 2 errors
  assert result(-0.5, 0.2, 0.004).mc_stable and result(-0.5, 0.2, None).mc_stable
