"""The pod walkthrough of docs/scaling.md ("Training on a TPU pod, start to finish"), its
commands read from the page and run here against the session's GCS API server
(tests/gcs_server.py), in order: rove-prepare into the bucket, the training command every
worker runs (one CPU process here), and rove-export.

What a CPU host without network needs instead (every other word is the page's):
  $BUCKET                          a fresh bucket
  '/data/fineweb-edu/*.parquet'    a small parquet corpus written by the test
  tiktoken:gpt2                    bytes (tiktoken downloads its vocabulary at first use)
  configs/gpt2_124m.py             configs/tiny.py, at test size (SIZE), W&B offline
  --config.profile_steps=100:104   2:3 (the run has 4 steps)
  gcloud ... --command="cd rove-jax && CMD"   CMD, in the checkout
Not run: the pip lines (installed already) and the ahead-of-time dry run, which needs libtpu
(kept out of CI; tests/aot/test_compile.py runs it where libtpu is installed).
"""

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from rove_jax.storage import paths
from tests import gcs_server
from tests.conftest import subprocess_env
from tests.test_readme import PAGES, extract

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = (
  PAGES["docs/scaling.md"]
  .split("### Training on a TPU pod, start to finish", 1)[1]
  .split("\n### ", 1)[0]
)
SIZE = [
  "--config.steps=4",
  "--config.optim.warmup_steps=1",
  "--config.model.max_len=32",
  "--config.data.seq_len=32",
  "--config.data.batch_size=4",
  "--config.log_every=1",
  "--config.checkpoint_every=2",
  "--config.eval_every=4",
  "--config.eval_batches=1",
  "--config.progress=False",
  "--config.sample_tokens=0",
  "--config.wandb.mode=offline",
]
PROGRAMS = {
  "rove-prepare": [sys.executable, "-m", "rove_jax.cli.prepare"],
  "rove-export": [sys.executable, "-m", "rove_jax.cli.export"],
  "python": [sys.executable],
}


def write_parquet(directory) -> str:
  import pyarrow as pa
  import pyarrow.parquet as pq

  rng = np.random.default_rng(0)
  words = ["def", "return", "self", "value", "class", "import", "for", "in", "if", "(", ")"]
  docs = [" ".join(rng.choice(words, size=300)) for _ in range(40)]
  os.makedirs(directory, exist_ok=True)
  for i in range(2):  # two shards: the validation split holds out files
    pq.write_table(pa.table({"text": docs[i::2]}), os.path.join(directory, f"part-{i}.parquet"))
  return os.path.join(directory, "*.parquet")


def runnable(text: str, bucket: str, corpus: str):
  """The README command as this host runs it (argv), or None for one it cannot run."""
  if text.startswith("pip ") or "--config.dry_run=True" in text:
    return None
  inner = re.fullmatch(r'gcloud .*--command="cd rove-jax && (.*)"', text)
  text = inner.group(1) if inner else text
  text = (
    text.replace("gs://$BUCKET", bucket)
    .replace("'/data/fineweb-edu/*.parquet'", shlex.quote(corpus))
    .replace("tiktoken:gpt2", "bytes")
    .replace("configs/gpt2_124m.py", "configs/tiny.py")
    .replace("--config.profile_steps=100:104", "--config.profile_steps=2:3")
  )
  words = shlex.split(text)
  if words[0] == "python":
    words[1] = os.path.join(ROOT, words[1])
  argv = PROGRAMS[words[0]] + words[1:]
  return argv + SIZE if "train.py" in text else argv


@pytest.mark.slow
def test_the_pod_walkthrough_runs_against_a_bucket(tmp_path):
  bucket = gcs_server.new_bucket()
  corpus = write_parquet(str(tmp_path / "fineweb-edu"))
  commands = [c.text for c in extract(SECTION) if not c.inline]
  assert [c.split()[0] for c in commands] == [
    "pip",
    "rove-prepare",
    "python",
    "gcloud",
    "pip",
    "rove-export",
  ], commands
  env = subprocess_env(devices=1, HOME=str(tmp_path / "home"))  # W&B and shard caches there
  ran = []
  for text in commands:
    argv = runnable(text, bucket, corpus)
    if argv is None:
      continue
    done = subprocess.run(
      argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )  # the page's commands run in the checkout
    assert done.returncode == 0, f"{text}\n{done.stderr[-3000:]}"
    ran.append(argv[argv.index("-m") + 1] if "-m" in argv else "train.py")
  assert ran == ["rove_jax.cli.prepare", "train.py", "rove_jax.cli.export"]
  run = f"{bucket}/runs/124m_rove"
  manifest = json.loads(paths.read_bytes(f"{bucket}/prepared/fineweb-gpt2/manifest.json"))
  assert manifest["tokenizer"]["spec"] == "bytes"
  names = paths.walk_files(run)
  assert any(n.startswith("tensorboard/") for n in names), names  # step 4 of the README
  assert any(n.startswith("profile/") for n in names), names  # the trace of steps 2-3
  assert paths.read_text(f"{run}/wandb-id.txt").strip()
  assert [
    json.loads(l)["step"]
    for l in paths.read_text(f"{run}/metrics.jsonl").splitlines()
    if "loss" in json.loads(l)
  ] == [1, 2, 3, 4]
  from rove_jax.nn import pretrained

  config, _ = pretrained.load(f"{bucket}/exports/124m_rove")
  assert config.pos_encoding == "rove" and config.max_len == 32
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
