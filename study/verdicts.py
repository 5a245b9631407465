"""The verdict rules of results/README.md: seed-level tests decide, and a comparison whose models
cannot do the task gets no verdict.

Seed level: a comparison of encodings A and B over paired training seeds has one difference of
the per-run statistic per seed pair (stats.Comparison.seed_diffs). Its verdict on the claim "A is
`claim` than B" comes from the paired t-test over those differences (two-sided, ALPHA): below
ALPHA it is "supports" when the mean difference lies on the claimed side and "contradicts"
otherwise; "inconclusive" at or above ALPHA. The exact sign-flip test over the same pairs is
reported beside it (with 3 pairs it cannot go below 0.25: a t verdict the sign-flip test
cannot reach rests on the t-test's normality). The bootstrap interval (study/stats.py) stays
the interval of the effect; it no longer decides. Without MIN_PAIRS seed pairs there is no
seed-level test, and the verdict says so (FEW_PAIRS), never supports or contradicts.

Measurability: an accuracy, or an answer NLL whose accuracy is known, measures a capability
only where some compared model does the task better than a guess. `chance` is the accuracy of
a uniform guess among the task's possible answers (computed per task: `recall_chance`,
`icl_chance`, 0 for open-ended answers such as RULER's); a comparison where every compared
model is at or below chance + MARGIN gets NOT_MEASURABLE, never supports or contradicts.
"""

from __future__ import annotations

from typing import Optional, Sequence

from study import multiplicity

ALPHA = 0.05
MIN_PAIRS = 2
# How far above chance an accuracy must be (in accuracy, absolute) for a model to count as
# doing the task: every compared model at or below chance + MARGIN is "not measurable". With
# chance 0 (open-ended answers) this is the floor of the earlier rule (5 %).
MARGIN = 0.05
NOT_MEASURABLE = "not measurable at this scale"
FEW_PAIRS = f"inconclusive: fewer than {MIN_PAIRS} seed pairs, no seed-level test"
# Synthetic ICL tasks (rove_jax/evaluation/icl/synthetic.py) whose answer is one of a few
# values: flip_flop reads back a bit. The others' answers are open-ended strings (words,
# numbers, bracket sequences), where a guess is right with probability about 0.
ICL_CHOICES = {"flip_flop": 2}
# Decided verdicts: the adjustment (multiplicity.adjusted_verdict) acts on these only.
DECIDED = ("supports", "contradicts")


def seed_tests(diffs: Sequence[float]) -> dict:
  """{"t": multiplicity.paired_t, "sign_flip": multiplicity.sign_flip} of the seed-pair
  differences (each None with fewer than 2 pairs)."""
  diffs = list(diffs)
  return {"t": multiplicity.paired_t(diffs), "sign_flip": multiplicity.sign_flip(diffs)}


def comparison_diffs(result) -> tuple:
  """A stats.Comparison's seed-pair differences; () when its seeds are not paired."""
  return tuple(result.seed_diffs) if result is not None and result.seeds_paired else ()


def from_diffs(diffs: Sequence[float], claim: str = "lower", alpha: float = ALPHA) -> str:
  """The verdict on "A is `claim` than B" from the seed-pair differences A - B (module
  docstring): the paired t-test's two-sided p against alpha, the side from the mean."""
  if claim not in ("lower", "higher"):
    raise ValueError(f"claim must be 'lower' or 'higher', got {claim!r}")
  t = multiplicity.paired_t(list(diffs))
  if t is None:
    return FEW_PAIRS
  if not t["p"] < alpha:
    return "inconclusive"
  side = "lower" if t["mean"] < 0 else "higher"
  return "supports" if side == claim else "contradicts"


def verdict(result, claim: str = "lower") -> str:
  """`from_diffs` of a stats.Comparison (None: "not measured")."""
  if result is None:
    return "not measured"
  return from_diffs(comparison_diffs(result), claim)


def near_chance(counts: Sequence[Optional[tuple]], chance: float = 0.0) -> bool:
  """Whether every count (correct, answers) is at or below chance + MARGIN (missing or empty
  counts are ignored; False when none is left)."""
  got = [c for c in counts if c is not None and c[1]]
  return bool(got) and all(k / n <= chance + MARGIN for k, n in got)


def measurable_note(
  counts: Sequence[Optional[tuple]], chance: float, names: Sequence[str]
) -> Optional[str]:
  """NOT_MEASURABLE with the counts and chance behind it, or None when a model is above
  chance + MARGIN."""
  if not near_chance(counts, chance):
    return None
  shown = ", ".join(
    f"{name} {'-' if c is None else f'{c[0]}/{c[1]}'}" for name, c in zip(names, counts)
  )
  return f"{NOT_MEASURABLE}: {shown} right, chance {chance:.3g} + margin {MARGIN:g}"


def recall_chance(spec: Optional[str]) -> float:
  """Chance accuracy of a retrieval task (rove_jax/tasks/recall.py's RecallSpec text): a guess
  among the `values` answers a query can have (mqar and lastwrite: a key's values; offset: the
  context alphabet); 0 without a spec."""
  if not spec:
    return 0.0
  from rove_jax.tasks.recall import RecallSpec

  return 1.0 / RecallSpec.parse(spec).values


def icl_chance(counts_by_task: dict) -> float:
  """Chance accuracy of synthetic ICL tasks pooled: each task's 1 / ICL_CHOICES (0 for
  open-ended answers) weighted by its answers, from {task: (correct, answers)}."""
  total = sum(n for _, n in counts_by_task.values())
  if not total:
    return 0.0
  return sum(n / ICL_CHOICES[t] for t, (_, n) in counts_by_task.items() if t in ICL_CHOICES) / total


def study_icl_chance(st, tasks) -> float:
  """`icl_chance` of a numbers.Study's synthetic ICL `tasks` (their answers counted on the
  study's first encoding: every encoding is scored on the same prompts)."""
  return icl_chance({t: st.icl_count(st.order[0], [t]) or (0, 0) for t in tasks})
