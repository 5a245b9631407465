"""Evaluation of trained runs: perplexity vs length (+/- YaRN), RULER scored by answer NLL,
in-context learning, reports and plots. The command line is `rove-eval` (or `python -m eval`
from a checkout): rove_jax.evaluation.cli.

Modules: scoring (restore a run, score windows and prompt/answer pairs), perplexity, ruler,
icl, report (report.json/md and plots), results_writeup (the results/ README of
`make reproduce`).
"""
