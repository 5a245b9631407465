"""The small-scale replication of the paper's comparison (`make reproduce`): a 4-layer,
d_model 256 GPT (3.3M parameters) on the embedded stdlib corpus, byte tokens, 128-token
context, 16 x 128 tokens a step for 300 steps, sized with reproduce.py's evaluation to fit
about 2 hours on 2 cores (the measured times are in bench/RESULTS.md). reproduce.py sets
model.pos_encoding and seed per run.

python train.py --config study/configs/reproduce.py --workdir runs/reproduce/rove-s0 \
    --config.model.pos_encoding=rove --config.seed=0
"""

from rove_jax.train.run_config import base_config


def get_config():
  c = base_config("tiny")
  c.model.n_layer = 4
  c.model.d_model = 256
  c.model.n_head = 4
  c.model.max_len = 128
  c.model.pos_encoding = "rove"
  c.data.source = "stdlib"
  c.data.tokenizer = "bytes"
  c.data.seq_len = 128
  c.data.batch_size = 16
  c.optim.lr = 2e-3
  c.optim.warmup_steps = 50
  c.steps = 300
  c.log_every = 20
  c.eval_every = 100
  c.eval_batches = 16
  c.checkpoint_every = 100
  return c
