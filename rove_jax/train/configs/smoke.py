"""A first run that finishes in about a minute on 2 CPU cores: the demo's model and data
(configs/demo.py: 3 layers x 128, 0.6M parameters, byte tokens of the embedded stdlib corpus,
32 x 64 tokens a step) for 100 steps, a validation loss at steps 50 and 100 and a generated
sample at the end.

rove-train --config smoke --workdir runs/smoke
"""

import dataclasses

from rove_jax.train.configs import demo
from rove_jax.train.run_config import RunConfig


def get_config() -> RunConfig:
  c = demo.get_config()
  return dataclasses.replace(
    c,
    optim=dataclasses.replace(c.optim, warmup_steps=10),
    steps=100,
    log_every=10,
    eval_every=50,
    eval_batches=4,
    checkpoint_every=50,
    sample_tokens=100,
  )
