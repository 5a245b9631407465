"""The paper's medium model: GPT-2 354M (24 x 1024, 16 heads), context 1024, the GPT-2
tokenizer (assumed), FineWeb-Edu parquet shards downloaded by the user (a `text` column); see
rove_jax/train/run_config.py:paper_config for every setting and for which of them the paper
states (model size, FineWebEdu-10B, context 1024) and which are assumed (batch, steps, learning
rate 3e-4, ...).

python train.py --config configs/gpt2_354m.py --workdir runs/gpt2_354m_rove \\
    --config.data.path='/data/fineweb-edu/sample/10BT/*.parquet'
RoPE twin: --config.model.pos_encoding=rope --workdir runs/gpt2_354m_rope
"""

from rove_jax.train.run_config import RunConfig, paper_config


def get_config() -> RunConfig:
  return paper_config("gpt2_354m", lr=3e-4)
