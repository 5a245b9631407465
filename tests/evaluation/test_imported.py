"""rove-eval on a model directory (rove_jax.evaluation.imported): a tiny transformers Llama
with its tokenizer.json is scored like a training run, its perplexity equal to a float64
log-softmax of the model's own logits, YaRN applied above the training length; an export
supplies the training length it records; a directory without a tokenizer is one error line."""

import json
import pathlib
import re
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from rove_jax import data as data_lib
from rove_jax.cli import eval as eval_cli
from rove_jax.data import tokenization
from rove_jax.evaluation import imported
from rove_jax.nn import pretrained
from tests.train.test_init_from import checkpoint  # noqa: F401 - the tiny Llama + tokenizer

TEXT = (
  "def scale(values, factor):\n    return [v * factor for v in values]\n\n"
  "for name in sorted(os.listdir(path)):\n    print(name, len(name))\n"
) * 12


def _nll_float64(cfg, params, window):
  """Summed NLL of window[1:] given window[:-1]: the model's logits, a float64 log-softmax."""
  logits = np.asarray(pretrained.build(cfg, params)(jnp.asarray(window[None, :-1])), np.float64)[0]
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  return -logp[np.arange(len(window) - 1), window[1:]].sum()


def test_rove_eval_scores_a_transformers_llama_directory(checkpoint, tmp_path, capsys):  # noqa: F811
  text = tmp_path / "held_out.txt"
  text.write_text(TEXT)
  out = tmp_path / "report"
  code = eval_cli.main(
    [
      "--workdir",
      checkpoint,
      "--data-path",
      str(text),
      "--tasks",
      "ppl",
      "--lengths",
      "16,32",
      "--train-len",
      "16",
      "--yarn",
      "both",
      "--ppl-tokens",
      "64",
      "--out",
      str(out),
      "--no-progress",
    ]
  )
  assert code == 0, capsys.readouterr().err
  rep = json.loads((out / "report.json").read_text())
  (run,) = rep["runs"]
  ppl = run["perplexity"]
  assert ppl["protocol"]["train_len"] == 16
  # the first window at L = 16 and 32, as trained: a float64 log-softmax of the logits
  tok = tokenization.get_tokenizer(str(pathlib.Path(checkpoint) / "tokenizer.json"))
  corpus = data_lib.Corpus(source="text", path=str(text))
  tokens = np.asarray(data_lib.load_tokens(corpus, "train", tok))
  cfg, params = pretrained.load(checkpoint)
  for L in (16, 32):
    want = _nll_float64(cfg, params, tokens[: L + 1])
    got = ppl["none"][str(L)]["window_nll"][0]
    np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=str(L))
  # YaRN: the identity at the training length, a different model above it
  assert ppl["yarn"]["16"]["window_nll"] == ppl["none"]["16"]["window_nll"]
  assert ppl["yarn"]["32"]["loss"] != pytest.approx(ppl["none"]["32"]["loss"], rel=1e-4)


def test_an_export_supplies_its_training_length_and_text_defaults_to_the_stdlib(
  checkpoint, tmp_path
):  # noqa: F811
  cfg, params = pretrained.load(checkpoint)
  export = tmp_path / "export"
  pretrained.save(
    str(export),
    cfg,
    params,
    format="rove_jax",
    extra_config={"rove_jax_run": {"step": 7, "train_len": 24, "tokenizer": {}}},
  )
  shutil.copy(pathlib.Path(checkpoint) / "tokenizer.json", export / "tokenizer.json")
  run = imported.load_model(str(export))
  assert (run.train_len, run.step, run.name) == (24, 7, "export")
  assert run.config.data.source == "stdlib"
  assert imported.load_model(str(export), train_len=40).train_len == 40
  # a transformers directory: rope_scaling's original length, else max_position_embeddings
  assert imported.recorded_train_len({"max_position_embeddings": 64}) == 64
  assert (
    imported.recorded_train_len(
      {
        "max_position_embeddings": 64,
        "rope_scaling": {
          "rope_type": "yarn",
          "factor": 4.0,
          "original_max_position_embeddings": 16,
        },
      }
    )
    == 16
  )
  with pytest.raises(ValueError, match="--train-len"):
    imported.recorded_train_len({})


def test_a_model_directory_without_a_tokenizer_exits_2_naming_the_flag(
  checkpoint, tmp_path, capsys
):  # noqa: F811
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in ("config.json", "model.safetensors"):
    shutil.copy(pathlib.Path(checkpoint) / name, bare / name)
  assert imported.is_model_dir(str(bare))
  argv = [
    "--workdir",
    str(bare),
    "--tasks",
    "ppl",
    "--lengths",
    "16",
    "--train-len",
    "16",
    "--ppl-tokens",
    "32",
    "--yarn",
    "off",
    "--out",
    str(tmp_path / "report"),
    "--no-progress",
  ]
  with pytest.raises(SystemExit) as exit_:  # an argument error, before the model loads
    eval_cli.main(argv)
  err = capsys.readouterr().err
  assert exit_.value.code == 2
  last = err.strip().splitlines()[-1]
  assert "holds no tokenizer.json" in last and "--tokenizer PATH/tokenizer.json" in last, err
  assert "Traceback" not in err
  assert not (tmp_path / "report").exists()
  with pytest.raises(SystemExit):  # a --tokenizer that is not there is named
    eval_cli.main([*argv, "--tokenizer", str(tmp_path / "missing.json")])
  assert "--tokenizer" in capsys.readouterr().err
  # --tokenizer supplies it: the directory is scored
  code = eval_cli.main([*argv, "--tokenizer", str(pathlib.Path(checkpoint) / "tokenizer.json")])
  assert code == 0, capsys.readouterr().err
  assert (tmp_path / "report" / "report.json").exists()


def test_the_report_of_a_model_directory_goes_beside_it(tmp_path, monkeypatch):
  model = tmp_path / "hub" / "llama-tiny"
  model.mkdir(parents=True)
  (model / "config.json").write_text("{}")
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text("{}")  # a workdir that also holds a config.json
  here = tmp_path / "here"  # a checkout, say: nothing is written under the current directory
  here.mkdir()
  monkeypatch.chdir(here)
  assert eval_cli.default_out(str(model)) == str(tmp_path / "hub" / "llama-tiny-eval")
  assert eval_cli.default_out(str(model) + "/") == str(tmp_path / "hub" / "llama-tiny-eval")
  assert eval_cli.default_out("../hub/llama-tiny") == str(tmp_path / "hub" / "llama-tiny-eval")
  assert eval_cli.default_out(str(run)) == str(run / "eval")


def test_a_default_report_inside_a_python_package_is_refused(tmp_path, capsys):
  """The default report directory never lands in source code: a model directory or a workdir
  inside a package (a directory holding __init__.py) needs --out, an argument error before
  anything is created."""
  pkg = tmp_path / "src" / "pkg"
  model, run = pkg / "exports" / "tiny", pkg / "run"
  model.mkdir(parents=True)
  (run / "checkpoints").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (model / "config.json").write_text("{}")
  for workdir in (model, run):
    with pytest.raises(ValueError, match=re.escape(f"inside the Python package {pkg}; give --out")):
      eval_cli.default_out(str(workdir))
  with pytest.raises(SystemExit) as info:
    eval_cli.main(["--workdir", str(run)])
  assert info.value.code == 2 and "give --out DIR" in capsys.readouterr().err
  assert not (run / "eval").exists()
  args = eval_cli.parse_args(
    ["--workdir", str(run), "--out", str(tmp_path / "report")], check_files=True
  )
  assert args.out_dir == str(tmp_path / "report")
