"""A first run that finishes in about a minute on 2 CPU cores: the demo's model and data
(configs/demo.py: 3 layers x 128, 0.6M parameters, byte tokens of the embedded stdlib corpus,
32 x 64 tokens a step) for 100 steps, a validation loss at steps 50 and 100 and a generated
sample at the end.

rove-train --config smoke --workdir runs/smoke
"""

from rove_jax.train.configs import demo


def get_config():
  c = demo.get_config()
  c.optim.warmup_steps = 10
  c.steps = 100
  c.log_every = 10
  c.eval_every = 50
  c.eval_batches = 4
  c.checkpoint_every = 50
  c.sample_tokens = 100
  return c
