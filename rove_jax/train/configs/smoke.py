"""A first run that finishes in about a minute on 2 CPU cores: the demo's model (3 layers x 128,
0.6M parameters, a 64-token context) on byte tokens of the embedded stdlib corpus, 100 steps of
32 x 64 tokens, a validation loss at steps 50 and 100 and a generated sample at the end.

rove-train --config smoke --workdir runs/smoke
"""

from rove_jax.train.config_schema import base_config


def get_config():
  c = base_config("tiny")
  c.model.n_layer = 3
  c.model.d_model = 128
  c.model.n_head = 4
  c.model.pos_encoding = "rove"
  c.data.source = "stdlib"
  c.data.tokenizer = "bytes"
  c.data.seq_len = 64  # model.max_len follows
  c.data.batch_size = 32
  c.optim.lr = 3e-3
  c.optim.warmup_steps = 10
  c.steps = 100
  c.log_every = 10
  c.eval_every = 50
  c.eval_batches = 4
  c.checkpoint_every = 50
  c.sample_tokens = 100
  return c
