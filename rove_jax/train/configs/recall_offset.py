"""The mechanism in miniature: a 2-layer, d_model 64, 4-head GPT (d_ff 256, byte vocabulary,
0.12M parameters) trained at 32 tokens to retrieve the token k = 1..4 places after a marker
(rove_jax.tasks.recall_tasks' offset task: the answer is fixed by relative position alone;
loss on the answers only), 32 x 32 tokens a step, 300 steps. `make demo` trains it with RoVE
and with RoPE and scores both with `rove-eval --tasks recall` at 1x and 4x the training length.

rove-train --config recall_offset --workdir runs/offset_rove
rove-eval --workdir runs/offset_rove --tasks recall --recall-lengths 32,128
"""

from rove_jax.nn.model_config import GPTConfig
from rove_jax.train.run_config import DataConfig, OptimConfig, RunConfig

SEQ_LEN = 32


def get_config() -> RunConfig:
  return RunConfig(
    model=GPTConfig.tiny(
      n_layer=2, d_model=64, d_ff=256, n_head=4, max_len=SEQ_LEN, pos_encoding="rove"
    ),
    data=DataConfig(
      source="recall",
      seq_len=SEQ_LEN,
      batch_size=32,
      path="task=offset,pairs=1,queries=8,keys=4,values=16,train_docs=20000",
    ),
    optim=OptimConfig(lr=1e-3, warmup_steps=100),
    steps=300,
    log_every=100,
    eval_every=500,  # once, at the end
    eval_batches=8,
    checkpoint_every=500,
    sample_tokens=0,
  )
