"""Coverage of study/stats.py's seed-paired difference interval, in simulation.

  python -m bench.stats_coverage [--sets 400 --boot 400 --pairs 3,8]

Each simulated data set has `pairs` seed pairs of encodings A and B scored on 40 shared units:
score = shift + unit difficulty (sd 2, shared by every run) + seed effect (sd 0.5, shared by
the pair) + an encoding-by-seed effect (the sd varied) + unit noise (sd 1); A's shift is 0.3
above B's. It prints, per number of pairs and encoding-by-seed sd, how often the 95 % interval
of stats.paired_difference(pair_seeds=True) covers 0.3. results/README.md quotes these figures
(study/numbers.py's COVERAGE); the data sets are drawn from a fixed seed.
"""

from __future__ import annotations

import argparse

import numpy as np

from study import stats

INTER_SDS = (0.0, 0.1, 0.22, 0.5, 1.0)


def simulate(rng, pairs: int, inter_sd: float, n_units: int = 40, delta: float = 0.3):
  difficulty, shared = 2.0 * rng.normal(size=n_units), 0.5 * rng.normal(size=pairs)

  def runs(shift):
    return [
      shift + difficulty + shared[i] + inter_sd * rng.normal() + rng.normal(size=n_units)
      for i in range(pairs)
    ]

  return runs(delta), runs(0.0)


def coverage(pairs: int, inter_sd: float, sets: int, boot: int) -> float:
  rng, hits = np.random.default_rng(99), 0
  for k in range(sets):
    a, b = simulate(rng, pairs, inter_sd)
    r = stats.paired_difference(a, b, n_boot=boot, seed=k, pair_seeds=True)
    hits += r.lower <= 0.3 <= r.upper
  return hits / sets


def main(argv=None) -> None:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--sets", type=int, default=400)
  p.add_argument("--boot", type=int, default=400)
  p.add_argument("--pairs", default="3,8")
  args = p.parse_args(argv)
  for pairs in map(int, args.pairs.split(",")):
    got = [coverage(pairs, sd, args.sets, args.boot) for sd in INTER_SDS]
    print(
      f"{pairs} pairs, encoding-by-seed sd {' / '.join(f'{sd:g}' for sd in INTER_SDS)}: "
      f"{' / '.join(f'{100 * c:g}' for c in got)} %",
      flush=True,
    )


if __name__ == "__main__":
  main()
