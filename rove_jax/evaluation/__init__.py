"""Evaluation of trained runs: perplexity vs length (+/- YaRN), RULER scored by answer NLL,
in-context learning, reports and plots. The command line is `rove-eval`: rove_jax.cli.eval,
which builds an EvalConfig (config: what to evaluate and how) from its options.

Modules: config (EvalConfig, the suites), tasks (rove-eval's tasks on one run), scoring
(restore a run, score windows and prompt/answer pairs), imported (model directories: exports
and transformers checkpoints), perplexity, recall (a recall-trained run on its own task),
prompting (what RULER and ICL share: tokenizer protocol, filler text, fitting a prompt to a
length, answer scoring), ruler/ (suite, tasks, haystack, qa), icl/ (synthetic, files,
specs), report (the report.json schema and its validation), and its writers: report_md
(report.md's tables), plots (the PNGs) and report_files (the report directory, replaced
atomically). harness is the lm-evaluation-harness model "rove_jax" (the [harness] extra; it
imports lm_eval, so nothing else here imports it). The paper reproduction's write-up is study/,
outside the package.
"""
