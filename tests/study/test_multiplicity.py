"""study.multiplicity against values computed once with statsmodels 0.14
(multipletests, methods "holm" and "fdr_bh") and scipy.stats.ttest_1samp, committed here."""

import math

import pytest

from study import multiplicity as m

P = [0.012, 0.3, 0.0004, 0.049, 0.02, 0.7, 0.049, 0.11]
HOLM = [0.084, 0.6, 0.0032, 0.245, 0.12, 0.7, 0.245, 0.33]
BH = [0.048, 0.342857142857, 0.0032, 0.0784, 0.053333333333, 0.7, 0.0784, 0.146666666667]


def test_holm_and_benjamini_hochberg_match_statsmodels():
  assert m.holm(P) == pytest.approx(HOLM, abs=1e-12)
  assert m.benjamini_hochberg(P) == pytest.approx(BH, abs=1e-11)
  # one test: nothing to adjust; ties keep their order
  assert m.holm([0.03]) == [0.03] and m.holm([0.01, 0.01]) == [0.02, 0.02]


def test_adjusted_verdicts_never_strengthen_a_raw_one():
  assert m.adjusted_verdict("supports", 0.049) == "supports"
  assert m.adjusted_verdict("supports", 0.05) == "inconclusive"
  assert m.adjusted_verdict("contradicts", 0.2) == "inconclusive"
  assert m.adjusted_verdict("inconclusive", 0.001) == "inconclusive"
  assert m.adjusted_verdict("at the floor: 0/10", None) == "at the floor: 0/10"


def test_paired_t_matches_scipy():
  got = m.paired_t([-0.15, -0.154, -0.004, -0.08, -0.12])
  assert got["n"] == 5 and got["df"] == 4
  assert got["t"] == pytest.approx(-3.6591295430987922, rel=1e-12)
  assert got["p"] == pytest.approx(0.021596867268333667, rel=1e-9)
  assert (got["lower"], got["upper"]) == pytest.approx(
    (-0.17869123696375233, -0.02450876303624766), rel=1e-9
  )
  assert m.paired_t([0.1]) is None
  same = m.paired_t([0.5, 0.5, 0.5])  # exact in binary: no spread at all
  assert same["p"] == 0.0 and same["t"] == float("inf")


@pytest.mark.parametrize("bad", [[0.1, 1.5], [float("nan")], [[0.1, 0.2]], [-0.01]])
def test_p_values_outside_0_1_are_refused(bad):
  with pytest.raises(ValueError, match="p-values must"):
    m.holm(bad)


def test_sign_flip_counts_the_sign_vectors_by_hand():
  # |sum| of +-3 +-1 +-2 +-2 is at least the observed 6 for (3, 1, 2, 2), (3, -1, 2, 2) and
  # their negations: 4 of 16
  got = m.sign_flip([3.0, -1.0, 2.0, 2.0])
  assert (got["n"], got["mean"], got["p"], got["p_min"]) == (4, 1.5, 4 / 16, 2 / 16)
  assert m.sign_flip([0.1, 0.2, 0.3])["p"] == 0.25  # every sign the same: the least, 2 / 2**3
  assert m.sign_flip([1.0, -1.0])["p"] == 1.0  # mean 0: every vector is as extreme
  assert m.sign_flip([0.5]) is None
  with pytest.raises(ValueError, match="2\\*\\*n"):
    m.sign_flip([1.0] * (m.MAX_SIGN_FLIP_PAIRS + 1))


def test_tost_matches_scipy_one_sided_t_tests_and_hand_values():
  from scipy import stats as sps

  d = [-0.004, 0.003, -0.001, 0.002, 0.0005, -0.002]
  r = m.tost(d, 0.01)
  assert r["p_low"] == pytest.approx(sps.ttest_1samp(d, -0.01, alternative="greater").pvalue)
  assert r["p_high"] == pytest.approx(sps.ttest_1samp(d, 0.01, alternative="less").pvalue)
  assert r["outcome"] == "equivalent" and r["p"] == r["p_equiv"] < 0.05
  # by hand: d = [-3, -2, -1] (mean -2, sd 1, se 1/sqrt 3), margin 0.5: t = -1.5 sqrt 3 = -2.598
  r = m.tost([-3.0, -2.0, -1.0], 0.5)
  assert r["p_below"] == pytest.approx(0.0608, abs=1e-4)  # t.cdf(-2.598, 2)
  assert r["outcome"] == "inconclusive" and r["df"] == 2
  assert r["upper"] == pytest.approx(-2 + 2.919986 / math.sqrt(3), abs=1e-5)  # t(0.95, 2)
  r = m.tost([-3.0, -2.5, -2.0, -2.2], 0.5)
  assert r["outcome"] == "lower" and r["p"] == r["p_below"] < 0.05
  assert m.tost([3.0, 2.5, 2.0, 2.2], 0.5)["outcome"] == "higher"
  assert m.tost([0.1, 0.1], 0.5)["outcome"] == "equivalent"  # no spread, inside the margin
  assert m.tost([1.0], 0.5) is None
  with pytest.raises(ValueError, match="margin"):
    m.tost([1.0, 2.0], 0.0)
