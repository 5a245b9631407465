"""The paper's medium model: GPT-2 354M (24 x 1024, 16 heads), context 1024, GPT-2 tokenizer,
FineWeb-Edu parquet shards downloaded by the user (a `text` column).

python train.py --config configs/gpt2_354m.py --workdir runs/gpt2_354m_rove \
    --config.data.path='/data/fineweb-edu/sample/10BT/*.parquet'
RoPE twin: --config.model.pos_encoding=rope --workdir runs/gpt2_354m_rope
"""

from rove_jax.config import base_config


def get_config():
  c = base_config("gpt2_354m")
  c.model.pos_encoding = "rove"
  c.model.dtype = "bfloat16"  # float32 master weights (param_dtype)
  c.data.source = "parquet"
  c.data.path = "fineweb-edu/*.parquet"
  c.data.tokenizer = "tiktoken:gpt2"
  c.data.seq_len = 1024
  c.data.batch_size = 512  # 512 x 1024 = 0.5M tokens a step
  c.optim.lr = 3e-4
  c.optim.warmup_steps = 700
  c.optim.weight_decay = 0.1
  c.optim.grad_accum = 1
  c.steps = 19073  # ~10B tokens
  c.log_every = 10
  c.eval_every = 500
  c.eval_batches = 40
  c.checkpoint_every = 1000
  c.keep_checkpoints = 3
  c.sample_tokens = 0
  return c
