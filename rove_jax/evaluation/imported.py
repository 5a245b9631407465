"""A model directory as a run to evaluate: a rove-export or a transformers checkpoint (gpt2,
llama, qwen2, mistral; rove_jax.nn.pretrained), scored by rove-eval like a training workdir.

A model directory has no training data and no checkpoint metadata, so what a workdir's
checkpoint records is taken from the directory and the command line:
  * the tokenizer: the directory's tokenizer.json (or the byte/tiktoken spec an export records);
  * the training length T (evaluation lengths, YaRN factors, report labels): the length an export
    records, else the rope_scaling's original_max_position_embeddings, else
    max_position_embeddings; `train_len` overrides it;
  * the text scored: `data_path` (text or parquet; its held-out split is RULER's haystack and
    Figure 1's sample), else the embedded default corpus (the Python standard library).
"""

from __future__ import annotations

import json
from typing import Optional

from rove_jax.data import tokenization
from rove_jax.evaluation.scoring import Run
from rove_jax.nn import param_files, pretrained
from rove_jax.storage import paths
from rove_jax.train.run_config import DataConfig, RunConfig


def is_model_dir(path: str) -> bool:
  """Whether `path` (resolved) is a model directory rather than a training workdir: it holds a
  config.json and no checkpoints/."""
  return paths.isfile(paths.join(path, param_files.CONFIG)) and not paths.isdir(
    paths.join(path, "checkpoints")
  )


def recorded_train_len(hf: dict) -> int:
  """The training length a config.json records (module docstring)."""
  run_len = (hf.get("rove_jax_run") or {}).get("train_len")
  if run_len:
    return int(run_len)
  original = (hf.get("rope_scaling") or {}).get("original_max_position_embeddings")
  if original:
    return int(original)
  if hf.get("max_position_embeddings"):
    return int(hf["max_position_embeddings"])
  if hf.get("n_positions"):  # GPT-2's name
    return int(hf["n_positions"])
  raise ValueError("its config.json records no length (max_position_embeddings); give --train-len")


def has_tokenizer(path: str) -> bool:
  """Whether the model directory at `path` holds or records its tokenizer (ValueError: a
  config.json whose tokenizer record is malformed)."""
  return pretrained.inspect(paths.resolve(path, what="model directory")).tokenizer is not None


def load_model(
  path: str,
  *,
  data_path: Optional[str] = None,
  train_len: Optional[int] = None,
  tokenizer: Optional[str] = None,
) -> Run:
  """The model directory at `path` as a Run (module docstring); `tokenizer` (a tokenizer.json
  path or a spec) is used when the directory holds and records none.

  Raises:
    ValueError: not a loadable model directory (pretrained.load says which keys), no
      tokenizer in it, or a tokenizer whose ids do not fit the model's vocabulary.
  """
  path = paths.resolve(path, what="model directory")
  config, params = pretrained.load(path)
  hf = json.loads(paths.read_text(paths.join(path, param_files.CONFIG)))
  spec = pretrained.inspect(path).tokenizer or tokenizer
  if spec is None:
    raise ValueError(
      f"{path} holds no tokenizer.json and records no tokenizer; pass "
      f"--tokenizer PATH/tokenizer.json (the model's)"
    )
  tokenizer = tokenization.get_tokenizer(spec)
  if tokenizer.vocab_size > config.vocab_size:
    raise ValueError(
      f"the tokenizer of {path} has {tokenizer.vocab_size} ids but the model's "
      f"vocabulary is {config.vocab_size}: it is not this model's tokenizer"
    )
  try:
    T = train_len or recorded_train_len(hf)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
  if data_path:
    data = DataConfig(
      source="parquet" if data_path.endswith(".parquet") else "text",
      path=data_path,
      seq_len=T,
      tokenizer=spec,
    )
  else:
    data = DataConfig(seq_len=T, tokenizer=spec)
  step = (hf.get("rove_jax_run") or {}).get("step", 0)
  return Run(
    workdir=path,
    name=paths.basename(path),
    step=int(step),
    config=RunConfig(model=config, data=data),
    params=params,
    tokenizer=tokenizer,
  )
