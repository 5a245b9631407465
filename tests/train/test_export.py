"""rove_jax.train.export: an export carries the tokenizer the run was trained with, records the
training length, and `export.load` gives back a model that encodes a prompt and decodes what
it generates."""

from __future__ import annotations

import json
import warnings

import chex
import jax
import numpy as np
import pytest

from rove_jax import scaling
from rove_jax.data import tokenization
from rove_jax.evaluation import scoring
from rove_jax.nn import decoding, param_files, pretrained
from rove_jax.nn.model import generate
from rove_jax.train import export, run_reader
from rove_jax.train import loop as training
from tests.conftest import small_config

PROMPT = "def main(argv):\n    "


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
  """A 4-step run with a trained BPE tokenizer (a file in the workdir), trained on 32 tokens."""
  tmp = tmp_path_factory.mktemp("bpe_run")
  c = small_config(tmp, steps=4, **{"data.tokenizer": "bpe:300", "data.seq_len": 32})
  result = training.train(c, str(tmp / "run"), devices=jax.devices()[:1], log=lambda *a: None)
  return tmp / "run", result


def test_a_bpe_export_carries_its_tokenizer_and_generates_text(bpe_run, tmp_path):
  workdir, result = bpe_run
  done = export.export_run(str(workdir), str(tmp_path / "out"), report=lambda *a: None)
  assert done["format"] == "rove_jax" and done["step"] == 4
  written = json.loads((tmp_path / "out" / param_files.CONFIG).read_text())
  assert written["max_position_embeddings"] == 32 == written["rove_jax_run"]["train_len"]
  assert (tmp_path / "out" / export.TOKENIZER_FILE).is_file()

  loaded = export.load(str(tmp_path / "out"))
  assert loaded.tokenizer.fingerprint == result.tokenizer.fingerprint
  assert loaded.config == result.model_config and loaded.config.max_len == 32
  ids = loaded.encode(PROMPT)
  np.testing.assert_array_equal(ids, result.tokenizer.encode(PROMPT))
  assert loaded.decode(ids) == PROMPT
  # Greedy text equals decoding the checkpoint's own generate by hand.
  _, params, _ = run_reader.read_run(str(workdir), lambda meta: result.params)
  by_hand = generate(
    pretrained.build(result.model_config, params),
    ids[None],
    12,
    temperature=0.0,
    valid_vocab=result.tokenizer.vocab_size,
  )
  want = result.tokenizer.decode(np.asarray(by_hand[0, len(ids) :]))
  assert loaded.generate(PROMPT, 12) == want and len(want) > 0


def test_a_byte_export_needs_no_tokenizer_file(trained_run, tmp_path):
  export.export_run(str(trained_run), str(tmp_path / "out"), report=lambda *a: None)
  assert not (tmp_path / "out" / export.TOKENIZER_FILE).exists()
  loaded = export.load(str(tmp_path / "out"))
  assert isinstance(loaded.tokenizer, tokenization.ByteTokenizer)
  assert loaded.decode(loaded.encode("héllo")) == "héllo"
  assert isinstance(loaded.generate("def ", 5, temperature=0.8, top_k=40, seed=1), str)


def test_the_export_holds_the_parameters_eval_restores(trained_run, tmp_path):
  """rove-export and rove-eval restore a run through one function: the exported weights and
  config are what scoring.load_run gives, bit for bit."""
  export.export_run(str(trained_run), str(tmp_path / "out"), report=lambda *a: None)
  config, params = pretrained.load(str(tmp_path / "out"))
  run = scoring.load_run(str(trained_run))
  assert config == run.model_config
  chex.assert_trees_all_close(params, run.params, rtol=0, atol=0)


def test_a_swapped_tokenizer_file_is_refused(bpe_run, tmp_path):
  workdir, _ = bpe_run
  export.export_run(str(workdir), str(tmp_path / "out"), report=lambda *a: None)
  other = tokenization.HFTokenizer.from_json(
    (tmp_path / "out" / export.TOKENIZER_FILE).read_text(), name="t"
  )
  text = json.loads(other.to_json())
  text["model"]["vocab"] = {
    k: (v + 1) % len(text["model"]["vocab"]) for k, v in text["model"]["vocab"].items()
  }
  (tmp_path / "out" / export.TOKENIZER_FILE).write_text(json.dumps(text))
  with pytest.raises(ValueError, match="not the one the model was trained with"):
    export.load(str(tmp_path / "out"))


def test_weights_without_a_run_record_are_named(tmp_path, trained_run):
  export.export_run(str(trained_run), str(tmp_path / "out"), report=lambda *a: None)
  config = json.loads((tmp_path / "out" / param_files.CONFIG).read_text())
  del config["rove_jax_run"]
  (tmp_path / "out" / param_files.CONFIG).write_text(json.dumps(config))
  with pytest.raises(ValueError, match="rove_jax.nn.pretrained.load"):
    export.load(str(tmp_path / "out"))


def test_a_tokenizer_file_named_outside_the_export_is_refused(tmp_path):
  """config.json's rove_jax_run.tokenizer.file is read only inside the export."""
  from flax import nnx

  from rove_jax.nn import pretrained
  from rove_jax.nn.model import GPT
  from rove_jax.nn.model_config import GPTConfig

  config = GPTConfig.tiny(vocab_size=64, n_layer=1, n_head=2, d_model=16, max_len=16)
  params = nnx.state(GPT(config, rngs=nnx.Rngs(0)), nnx.Param)
  for file, says in (("/etc/passwd", "is an absolute path"), ("../x.json", "leads outside it")):
    out = tmp_path / file.replace("/", "_")
    pretrained.save(
      str(out),
      config,
      params,
      extra_config={"rove_jax_run": {"step": 1, "tokenizer": {"file": file}}},
    )
    with pytest.raises(
      ValueError, match=r"rove_jax_run\.tokenizer\.file '" + file.replace(".", r"\.") + "' " + says
    ):
      export.load(str(out))


def test_an_exports_generate_takes_yarn_and_warns_at_the_callers_line(
  trained_run, tmp_path, monkeypatch
):
  """Past the training length (64), the warning names this file, not export.py, and its advice
  (rope_scaling=YaRN) can be followed on the export itself."""
  export.export_run(str(trained_run), str(tmp_path / "out"), report=lambda *a: None)
  loaded = export.load(str(tmp_path / "out"))
  prompt, new = "def f(x):\n    return x\n" * 4, 8  # 88 bytes
  yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}

  def said(**kw):
    monkeypatch.setattr(decoding, "_WARNED_PAST", set())
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      text = loaded.generate(prompt, new, **kw)
    return text, [w for w in caught if "past the training length" in str(w.message)]

  _, (warning,) = said()
  assert warning.filename == __file__ and "YaRN may help" in str(warning.message)
  real, passed = decoding.generate, []
  spy = lambda *a, **k: passed.append(k["rope_scaling"]) or real(*a, **k)
  monkeypatch.setattr(decoding, "generate", spy)
  text, warned = said(rope_scaling=yarn, temperature=1.0, seed=3)
  assert warned == [] and passed == [scaling.RopeScaling.coerce(yarn)]
  ids = loaded.encode(prompt)[None]
  by_hand = real(
    loaded.model(),
    ids,
    new,
    temperature=1.0,
    rng=jax.random.key(3),
    valid_vocab=loaded.tokenizer.vocab_size,
    rope_scaling=passed[0],
  )
  assert text == loaded.decode(np.asarray(by_hand[0, ids.shape[1] :]))
