"""study.verdicts: verdicts from the seed-level t-test (never the bootstrap interval), the few-
pairs and not-measurable rules, and chance per task."""

import pytest

from study import multiplicity, stats
from study import verdicts as v

# The RULER-with-YaRN case: three seed-pair gaps, all below 0, whose bootstrap interval
# excludes 0 while the paired t-test gives p = 0.155.
GAPS = (-0.341, -0.030, -0.245)


def _comparison(diffs, pair_seeds=True):
  """A Comparison whose seed pairs differ by `diffs` (two units per run)."""
  a = [[d, d] for d in diffs]
  b = [[0.0, 0.0] for _ in diffs]
  return stats.paired_difference(a, b, n_boot=400, seed=0, pair_seeds=pair_seeds)


def test_the_t_test_decides_not_the_bootstrap_interval():
  c = _comparison(GAPS)
  assert c.upper < 0 and stats.verdict(c) == "supports"  # the interval alone would support
  assert multiplicity.paired_t(GAPS)["p"] == pytest.approx(0.155, abs=5e-4)  # the figure
  assert v.verdict(c) == "inconclusive"
  assert v.verdict(_comparison([-0.30, -0.31, -0.29, -0.32])) == "supports"
  assert v.verdict(_comparison([-0.30, -0.31, -0.29, -0.32]), "higher") == "contradicts"
  assert v.verdict(_comparison([0.30, 0.31, 0.29, 0.32]), "higher") == "supports"
  assert v.verdict(None) == "not measured"


def test_fewer_than_two_seed_pairs_get_no_verdict():
  assert v.verdict(_comparison([-0.3])) == v.FEW_PAIRS
  assert v.verdict(_comparison([-0.3, -0.31], pair_seeds=False)) == v.FEW_PAIRS  # unpaired
  assert v.from_diffs([]) == v.FEW_PAIRS and v.FEW_PAIRS.startswith("inconclusive")
  tests = v.seed_tests([-0.3])
  assert tests == {"t": None, "sign_flip": None}
  with pytest.raises(ValueError, match="claim"):
    v.from_diffs(GAPS, "smaller")


def test_accuracy_within_the_margin_of_chance_is_not_measurable():
  chance = 1 / 16  # the offset task with 16 values
  at = round((chance + v.MARGIN) * 1000)  # correct of 1000 at chance + MARGIN
  assert v.near_chance([(at, 1000), (0, 1000)], chance)
  assert not v.near_chance([(at + 1, 1000), (0, 1000)], chance)  # one model above: measurable
  assert not v.near_chance([None, (0, 0)])  # nothing counted: no rule applies
  note = v.measurable_note([(3, 100), None], 0.0, ("RoVE", "RoPE"))
  assert note == f"{v.NOT_MEASURABLE}: RoVE 3/100, RoPE - right, chance 0 + margin {v.MARGIN:g}"
  assert v.measurable_note([(30, 100), (3, 100)], 0.0, ("RoVE", "RoPE")) is None


def test_chance_per_task():
  assert v.recall_chance("seq_len=32,pairs=1,values=16,task=offset") == 1 / 16
  assert v.recall_chance("seq_len=32,pairs=6,keys=6,values=8,task=mqar") == 1 / 8
  assert v.recall_chance(None) == 0.0
  # flip_flop reads back one of 2 bits; the open-ended tasks' chance is 0
  assert v.icl_chance({"flip_flop": (0, 30), "dyck": (0, 90)}) == pytest.approx(0.5 * 30 / 120)
  assert v.icl_chance({"dyck": (0, 0)}) == 0.0
