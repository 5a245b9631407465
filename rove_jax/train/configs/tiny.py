"""The CPU default: a 10.8M-parameter RoVE GPT on the embedded stdlib corpus, byte tokens.

python train.py --config configs/tiny.py --workdir runs/tiny
RoPE twin for a side-by-side run: add --config.model.pos_encoding=rope (another --workdir).
"""

from rove_jax.train.config_schema import base_config


def get_config():
  c = base_config("tiny")
  c.model.pos_encoding = "rove"
  c.data.source = "stdlib"
  c.data.seq_len = 256
  c.data.batch_size = 16
  c.optim.lr = 2e-3
  c.optim.warmup_steps = 50
  c.steps = 600
  c.log_every = 10
  c.eval_every = 100
  c.eval_batches = 8
  c.checkpoint_every = 100
  return c
