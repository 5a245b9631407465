"""`make demo`: a RoVE GPT and its RoPE twin, small enough that both train and are evaluated
on 2 CPU cores within the demo's budget: 3 layers x 128 (0.6M parameters), byte tokens of the
embedded stdlib corpus, a 64-token training context, 32 x 64 tokens a step. The evaluation
scores perplexity from 0.5x to 16x the training length without YaRN, with YaRN at L / 64, and
with one fixed YaRN factor (the effect that shows at this size: perplexity past the training
length).

python train.py --config configs/demo.py --workdir runs/demo/rove
python train.py --config configs/demo.py --workdir runs/demo/rope --config.model.pos_encoding=rope
"""

from rove_jax.train.config_schema import base_config


def get_config():
  c = base_config("tiny")
  c.model.n_layer = 3
  c.model.d_model = 128
  c.model.n_head = 4
  c.model.max_len = 64
  c.model.pos_encoding = "rove"
  c.data.source = "stdlib"
  c.data.seq_len = 64
  c.data.batch_size = 32
  c.optim.lr = 3e-3
  c.optim.warmup_steps = 30
  c.steps = 400
  c.log_every = 20
  c.eval_every = 200
  c.eval_batches = 8
  c.checkpoint_every = 200
  c.sample_tokens = 0
  return c
