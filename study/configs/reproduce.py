"""The small-scale replication of the paper's comparison (`make reproduce`): a 4-layer,
d_model 128 GPT with 2 heads of 64 (the paper's head dimension) on the embedded stdlib corpus,
byte tokens, 128-token context, 16 x 128 tokens a step for 300 steps. Sized so that 8 seed
pairs, NoPE, the training-length and learning-rate checks and the evaluation fit about 2.5
hours on 2 cores with two runs side by side (study.jobs; the measured times are in
bench/RESULTS.md). reproduce.py sets model.pos_encoding and seed per run (and steps or
optim.lr for the checks).

python train.py --config study/configs/reproduce.py --workdir runs/reproduce/rove-s0 \
    --config.model.pos_encoding=rove --config.seed=0
"""

from rove_jax.train.config_schema import base_config


def get_config():
  c = base_config("tiny")
  c.model.n_layer = 4
  c.model.d_model = 128
  c.model.n_head = 2
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
