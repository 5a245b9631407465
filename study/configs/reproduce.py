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

from rove_jax.nn.model_config import GPTConfig
from rove_jax.train.run_config import DataConfig, OptimConfig, RunConfig


def get_config() -> RunConfig:
  return RunConfig(
    model=GPTConfig.tiny(n_layer=4, d_model=128, n_head=2, max_len=128, pos_encoding="rove"),
    data=DataConfig(source="stdlib", tokenizer="bytes", seq_len=128, batch_size=16),
    optim=OptimConfig(lr=2e-3, warmup_steps=50),
    steps=300,
    log_every=20,
    eval_every=100,
    eval_batches=16,
    checkpoint_every=100,
  )
