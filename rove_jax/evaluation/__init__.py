"""Evaluation of trained runs: perplexity vs length (+/- YaRN), RULER scored by answer NLL,
in-context learning, reports and plots. The command line is `rove-eval` (or `python -m eval`
from a checkout): rove_jax.evaluation.cli.

Modules: cli (the command), scoring (restore a run, score windows and prompt/answer pairs),
perplexity, prompting (what RULER and ICL share: tokenizer protocol, filler text, fitting a
prompt to a length, answer scoring), ruler (+ ruler_tasks, ruler_haystack, ruler_qa), icl
(+ icl_specs, icl_files, icl_synthetic), report (report.json/md and plots), results_writeup
(the results/ README of `make reproduce`).
"""
