"""The mechanism in miniature: a 2-layer, d_model 64, 4-head GPT (d_ff 256, byte vocabulary,
0.12M parameters) trained at 32 tokens to retrieve the token k = 1..4 places after a marker
(rove_jax.tasks.recall_tasks' offset task: the answer is fixed by relative position alone;
loss on the answers only), 32 x 32 tokens a step, 300 steps. `make demo` trains it with RoVE
and with RoPE and scores both with `rove-eval --tasks recall` at 1x and 4x the training length.

rove-train --config recall_offset --workdir runs/offset_rove
rove-eval --workdir runs/offset_rove --tasks recall --recall-lengths 32,128
"""

from rove_jax.train.config_schema import base_config

SEQ_LEN = 32


def get_config():
  c = base_config("tiny")
  c.model.n_layer = 2
  c.model.d_model = 64
  c.model.d_ff = 256
  c.model.n_head = 4
  c.model.pos_encoding = "rove"
  c.data.source = "recall"
  c.data.path = "task=offset,pairs=1,queries=8,keys=4,values=16,train_docs=20000"
  c.data.seq_len = SEQ_LEN
  c.data.batch_size = 32
  c.optim.lr = 1e-3
  c.optim.warmup_steps = 100
  c.steps = 300
  c.log_every = 100
  c.eval_every = 500  # once, at the end
  c.eval_batches = 8
  c.checkpoint_every = 500
  c.sample_tokens = 0
  return c
