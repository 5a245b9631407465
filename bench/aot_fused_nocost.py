"""python -m bench.aot_fused_nocost ARGS: `python -m bench.aot ARGS` with the fused kernel's
pl.CostEstimate removed, so XLA counts its Mosaic calls the way it counts splash's (which
gives none): the cross-check of the fused rows in bench/RESULTS.md."""

import runpy
import sys

from rove_jax.kernels import fused_tiles

fused_tiles.cost = lambda *args, **kwargs: None  # pallas_call(cost_estimate=None)
sys.argv = ["bench.aot"] + sys.argv[1:]
runpy.run_module("bench.aot", run_name="__main__")
