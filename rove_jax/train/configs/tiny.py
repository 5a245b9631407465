"""The CPU default: a 10.8M-parameter RoVE GPT on the embedded stdlib corpus, byte tokens.

python train.py --config configs/tiny.py --workdir runs/tiny
RoPE twin for a side-by-side run: add --config.model.pos_encoding=rope (another --workdir).
"""

from rove_jax.nn.model_config import GPTConfig
from rove_jax.train.run_config import DataConfig, OptimConfig, RunConfig


def get_config() -> RunConfig:
  return RunConfig(
    model=GPTConfig.tiny(pos_encoding="rove"),
    data=DataConfig(source="stdlib", seq_len=256, batch_size=16),
    optim=OptimConfig(lr=2e-3, warmup_steps=50),
    steps=600,
    log_every=10,
    eval_every=100,
    eval_batches=8,
    checkpoint_every=100,
  )
