"""`make demo`: a RoVE GPT and its RoPE twin, small enough that both train and are evaluated
on 2 CPU cores within the demo's budget: 3 layers x 128 (0.6M parameters), byte tokens of the
embedded stdlib corpus, a 64-token training context, 32 x 64 tokens a step. The evaluation
scores perplexity from 0.5x to 16x the training length without YaRN, with YaRN at L / 64, and
with one fixed YaRN factor (the effect that shows at this size: perplexity past the training
length).

python train.py --config configs/demo.py --workdir runs/demo/rove
python train.py --config configs/demo.py --workdir runs/demo/rope --config.model.pos_encoding=rope
"""

from rove_jax.nn.model_config import GPTConfig
from rove_jax.train.run_config import DataConfig, OptimConfig, RunConfig


def get_config() -> RunConfig:
  return RunConfig(
    model=GPTConfig.tiny(n_layer=3, d_model=128, n_head=4, max_len=64, pos_encoding="rove"),
    data=DataConfig(source="stdlib", seq_len=64, batch_size=32),
    optim=OptimConfig(lr=3e-3, warmup_steps=30),
    steps=400,
    log_every=20,
    eval_every=200,
    eval_batches=8,
    checkpoint_every=200,
    sample_tokens=0,
  )
