"""The commands, one module each, above every layer they drive:

  train     rove-train (python train.py): train or resume a run from a config file
  dry_run   rove-train --config.dry_run=True: compile the train step, print its figures
  eval      rove-eval: perplexity, retrieval and ICL reports of trained runs
  prepare   rove-prepare: tokenize a corpus once into a prepared directory
  export    rove-export: a run's newest verified checkpoint as safetensors + config.json
  harness   rove-lm-eval: lm-evaluation-harness's run command with the "rove_jax" model
  errors    how they fail: one `error:` line and an exit status
  platforms no libtpu or CUDA-plugin noise on a host without that accelerator

Each is `python -m rove_jax.cli.NAME` too.
"""
