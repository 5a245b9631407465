"""How results/README.md writes its numbers: encoding and setting labels, length multiples,
intervals, comparisons and counts."""

from __future__ import annotations

from typing import Optional

from rove_jax.evaluation.plots import ENCODING_NAMES
from study import stats

# The write-up's labels (study.writeup and study.claims): encodings as the plots name them.
SETTING_NAMES = {"none": "no YaRN", "yarn": "YaRN, factor L/T", "yarn_fixed": "YaRN, fixed s"}


def name(enc: str) -> str:
  return ENCODING_NAMES.get(enc, enc)


def mult(length: int, base: Optional[int]) -> str:
  """ "4x" for a length 4 times the training length ("0.5x" below it)."""
  return f"{length / base:g}x" if base else "?"


def seeds_note(x) -> str:
  ok = getattr(x, "seed_spread_included", True)
  return "" if ok else " (1 seed: units only)"


def fmt_interval(iv: Optional[stats.Interval], digits: int = 2) -> str:
  """ "estimate [lower, upper]", "-" for None."""
  if iv is None:
    return "-"
  return f"{iv.estimate:.{digits}f} [{iv.lower:.{digits}f}, {iv.upper:.{digits}f}]" + seeds_note(iv)


def fmt_change(c, digits: int = 2) -> str:
  """A comparison: signed "+x [lo, hi]"; relative and exp contrasts in percent."""
  if c is None:
    return "-"
  if getattr(c, "contrast", "difference") in ("relative", "exp"):
    return f"{100 * c.estimate:+.1f} % [{100 * c.lower:+.1f}, {100 * c.upper:+.1f}]" + seeds_note(c)
  return f"{c.estimate:+.{digits}f} [{c.lower:+.{digits}f}, {c.upper:+.{digits}f}]" + seeds_note(c)


def fmt_count(kn: Optional[tuple[int, int]]) -> str:
  return "-" if kn is None else f"{kn[0]}/{kn[1]}"
