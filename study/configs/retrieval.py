"""The retrieval study's runs (python -m study.retrieval): the packaged recall_offset config's
2-layer, d_model 64, 4-head GPT (d_ff 256, byte vocabulary: 0.12M parameters) and optimizer,
trained on synthetic multi-query associative recall (rove_jax.tasks.recall: 6 one-token
records among filler, 8 queries, loss on the answers only) at 32 tokens, 32 x 32 tokens a step,
1,000 steps.

python train.py --config study/configs/retrieval.py --workdir runs/recall/rove-s0 \\
    --config.model.pos_encoding=rove --config.seed=0

The study sets model.pos_encoding and seed per run; the data (data.path, the generator's spec)
is the same for every run.

The sizing that chose this spec (models, steps, what was tried) is in bench/RESULTS.md.
"""

import dataclasses

from rove_jax.train.configs import recall_offset
from rove_jax.train.run_config import RunConfig

SEQ_LEN = 32
DATA = (
  f"seq_len={SEQ_LEN},pairs=6,queries=8,keys=6,values=8,train_docs=60000,val_docs=1000,"
  f"seed=0,answer_loss=1"
)
# The tasks `python -m study.retrieval --task NAME` runs: the generator spec (data.path) and the
# training steps (and other config fields, "config"). mqar is this config's own; the
# position-dependent tasks (answer by order or
# by distance, rove_jax.tasks.recall_tasks) train for fewer steps, which leaves headroom at the
# training length (their sizing is in bench/RESULTS.md).
TASKS = {
  "mqar": {"data": DATA, "steps": 1000},
  "lastwrite": {
    "data": f"seq_len={SEQ_LEN},pairs=8,queries=8,keys=4,values=8,train_docs="
    f"60000,val_docs=1000,seed=0,answer_loss=1,task=lastwrite",
    "steps": 150,
    "config": {"optim.warmup_steps": 30},
  },
  "offset": {
    "data": f"seq_len={SEQ_LEN},pairs=1,queries=8,keys=6,values=16,train_docs=60000,"
    f"val_docs=1000,seed=0,answer_loss=1,task=offset",
    "steps": 400,
  },
}


def get_config() -> RunConfig:
  c = recall_offset.get_config()  # the packaged model, optimizer and loop settings
  return dataclasses.replace(
    c, data=dataclasses.replace(c.data, path=DATA), steps=1000, progress=False
  )
