"""Training from a pretrained model (config.init_from): a tiny transformers Llama, switched to
RoVE, trains on the stdlib corpus from exactly its own parameters, with its own tokenizer, and
resumes bitwise; with RoPE its first loss is the loaded model's own loss on that batch."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

from rove_jax.data import tokenization
from rove_jax.nn import param_files, pretrained
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import loop as training
from rove_jax.train import resolve
from rove_jax.train.run_config import DataConfig, OptimConfig, RunConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests" / "reference_data" / "llama_family" / "llama_gqa"  # vocabulary 64
ONE = jax.devices()[:1]
STEPS = 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
  """The tiny Llama's directory with a tokenizer.json of 64 ids (a BPE over 40 characters plus
  end-of-text and unknown), as a transformers model directory holds one."""
  from tokenizers import Tokenizer, models, trainers

  out = tmp_path_factory.mktemp("llama")
  for name in ("config.json", "model.safetensors"):
    shutil.copy(LLAMA / name, out / name)
  tok = Tokenizer(models.BPE(unk_token="[UNK]"))
  trainer = trainers.BpeTrainer(
    vocab_size=64, special_tokens=["<|endoftext|>", "[UNK]"], limit_alphabet=40, show_progress=False
  )
  texts = [
    "def main(self, value):\n    return self.value + 1  # the value\n" * 20,
    "import os\nfor name in os.listdir(path):\n    print(name, len(name))\n" * 20,
  ]
  tok.train_from_iterator(texts, trainer=trainer)
  assert tok.get_vocab_size() == 64
  tok.save(str(out / "tokenizer.json"))
  return str(out)


def _config(path, rove=True, **over):
  """The RunConfig of a short stdlib run from the checkpoint at `path`, as rove-train builds it
  from a config file with `over` (and --config.model.pos_encoding=rove when `rove`) given."""
  c = RunConfig(
    model=GPTConfig.tiny(pos_encoding="rove"),
    init_from=path,
    # 20 files: with 8, Python 3.12's held-out split is one 97-byte file (3.13's with 16)
    data=DataConfig(source="stdlib", max_files=20, val_fraction=0.25, seq_len=32, batch_size=4),
    optim=OptimConfig(lr=1e-2, warmup_steps=1),  # step 1 runs at lr 0: it changes nothing
    steps=STEPS,
    log_every=1,
    eval_every=STEPS,
    eval_batches=1,
    checkpoint_every=3,
    progress=False,
    sample_tokens=0,
    tracking="none",
  )
  given = [("model.pos_encoding", "rove")] if rove else []
  return resolve.command_line(
    c, given + [(k, str(v)) for k, v in over.items()], log=lambda *a: None
  )


def _losses(workdir) -> list:
  with open(pathlib.Path(workdir) / "metrics.jsonl") as f:
    return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def _named(params) -> dict:
  return param_files.named(params)


def _assert_bitwise(a: dict, b: dict):
  assert a.keys() == b.keys()
  for k in a:
    assert a[k].dtype == b[k].dtype, k
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def straight(checkpoint, tmp_path_factory):
  """An uninterrupted RoVE run of STEPS steps from the Llama: (workdir, TrainResult)."""
  workdir = tmp_path_factory.mktemp("straight")
  return workdir, training.train(
    _config(checkpoint), str(workdir), devices=ONE, log=lambda *a: None
  )


def test_the_run_is_the_checkpoints_model_with_rove_and_its_tokenizer(checkpoint, straight):
  _, result = straight
  ckpt_cfg, _ = pretrained.load(checkpoint)
  assert result.model_config.pos_encoding == "rove" and ckpt_cfg.pos_encoding == "rope"
  for name in (
    "vocab_size",
    "n_layer",
    "n_head",
    "n_kv_head",
    "d_model",
    "d_ff",
    "rope_base",
    "rope_layout",
    "norm",
    "mlp",
    "tie_embeddings",
    "norm_eps",
  ):
    assert getattr(result.model_config, name) == getattr(ckpt_cfg, name), name
  want = tokenization.get_tokenizer(str(pathlib.Path(checkpoint) / "tokenizer.json"))
  assert result.tokenizer.fingerprint == want.fingerprint


def test_rove_from_llama_loss_falls(straight):
  workdir, _ = straight
  losses = _losses(workdir)
  assert len(losses) == STEPS
  assert losses[0] > 3.0  # the random tiny Llama knows nothing of this text (ln 64 = 4.16)
  # seen: 4.81 4.72 3.85 3.34 3.97 3.33 2.78 3.80 3.76 3.68 (noisy: 4 x 32 tokens a step)
  assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.4, losses


def test_starts_from_the_checkpoint_bitwise_and_resumes_bitwise(checkpoint, straight, tmp_path):
  workdir_a, result_a = straight
  _, loaded = pretrained.load(checkpoint)
  first = training.train(
    _config(checkpoint, run_steps=1), str(tmp_path), devices=ONE, log=lambda *a: None
  )
  assert first.step == 1
  # step 1 runs at learning rate 0: its parameters are the ones the run started from
  _assert_bitwise(_named(first.params), _named(loaded))
  out = []
  second = training.train(_config(checkpoint), str(tmp_path), devices=ONE, log=out.append)
  assert any(
    "resumed from step 1" in line and "init_from" in line and "ignored" in line for line in out
  ), out
  assert second.step == STEPS
  _assert_bitwise(_named(second.params), _named(result_a.params))
  assert _losses(tmp_path) == _losses(workdir_a)  # the same batches, the same losses
  assert not np.array_equal(_named(second.params)["embed"], _named(loaded)["embed"])


def test_rope_first_loss_is_the_loaded_models_loss(checkpoint, straight, tmp_path):
  from rove_jax import data as data_lib

  c = _config(checkpoint, run_steps=1, **{"model.pos_encoding": "rope"})
  result = training.train(c, str(tmp_path), devices=ONE, log=lambda *a: None)
  loss = _losses(tmp_path)[0]
  # the same first batch, from the same pipeline, scored by the loaded model in float64
  data = data_lib.prepare(c.data.corpus(), c.data.tokenizer, workdir=str(tmp_path))
  batch = next(
    data.train_iterator(
      seq_len=32, global_batch_size=4, seed=c.seed, packing=False, process_index=0, process_count=1
    )
  )
  cfg, params = pretrained.load(checkpoint)
  logits = np.asarray(pretrained.build(cfg, params)(batch["inputs"]), np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  picked = np.take_along_axis(logits, np.asarray(batch["targets"])[..., None], -1)[..., 0]
  direct = float(np.mean(logz - picked))
  np.testing.assert_allclose(loss, direct, rtol=1e-5)
  assert result.model_config.pos_encoding == "rope"
  assert abs(_losses(straight[0])[0] - loss) > 1e-4  # RoVE computes another function


def test_a_shape_override_is_refused_naming_the_field(checkpoint):
  with pytest.raises(
    ValueError,
    match=r"^model\.n_kv_head=4 disagrees with init_from=.*whose "
    r"n_kv_head is 2",
  ) as e:
    _config(checkpoint, **{"model.n_kv_head": 4})
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"model\.pos_encoding='nope' disagrees"):
    _config(checkpoint, **{"model.pos_encoding": "nope"})
  # non-shape settings may differ
  c = _config(
    checkpoint,
    **{
      "model.remat": "full",
      "model.max_len": 128,
      "model.rope_scaling.rope_type": "yarn",
      "model.rope_scaling.factor": 2.0,
    },
  )
  assert (c.model.remat, c.model.max_len, c.model.rope_scaling.rope_type) == ("full", 128, "yarn")
  assert (c.model.n_layer, c.model.d_model, c.model.vocab_size) == (2, 32, 64)


def test_another_kernel_drops_the_checkpoints_fused_variant():
  """A checkpoint trained with the Hopper fused kernel in a variant (model.fused_variant) starts
  a run on another kernel with the default variant (a variant of no other kernel), and keeps
  it where the run stays on the fused kernel."""
  from rove_jax.nn.model_config import GPTConfig
  from rove_jax.nn.pretrained import Inspected
  from rove_jax.train import init_from

  saved = GPTConfig.tiny(attention_impl="fused", fused_variant="2wg+bf16")
  ckpt = Inspected("ckpt", saved, "bytes")
  run = lambda **kw: init_from.configure(ckpt, GPTConfig.tiny(**kw), None, kw, log=lambda m: 0)[0]
  assert (run(attention_impl="xla").attention_impl, run(attention_impl="xla").fused_variant) == (
    "xla",
    "default",
  )
  assert run(remat="full").fused_variant == "2wg+bf16"
  assert run(attention_impl="fused", fused_variant="bf16").fused_variant == "bf16"


def test_a_tokenizer_that_is_not_the_checkpoints_is_refused(checkpoint, tmp_path):
  with pytest.raises(
    ValueError,
    match=r"data\.tokenizer='bytes' is not the tokenizer of "
    r"init_from=",
  ):
    _config(checkpoint, **{"data.tokenizer": "bytes"})
  # the same tokenizer by another path is the same tokenizer
  copy = tmp_path / "same.json"
  shutil.copy(pathlib.Path(checkpoint) / "tokenizer.json", copy)
  assert _config(checkpoint, **{"data.tokenizer": str(copy)}).data.tokenizer == str(copy)


def test_a_checkpoint_without_tokenizer_needs_one_given(tmp_path):
  for name in ("config.json", "model.safetensors"):
    shutil.copy(LLAMA / name, tmp_path / name)
  with pytest.raises(ValueError, match=r"holds no tokenizer\.json.*data\.tokenizer"):
    _config(str(tmp_path))
  # one given is taken, and must fit the vocabulary of 64
  with pytest.raises(
    ValueError,
    match=r"tokenizer 'bytes' has 257 ids but init_from=.* has "
    r"a vocabulary of 64",
  ):
    _config(str(tmp_path), **{"data.tokenizer": "bytes"})


def test_a_missing_init_from_is_refused_before_any_work(tmp_path):
  missing = tmp_path / "no_such_model"
  with pytest.raises(ValueError, match=r"^init_from=.*no_such_model: no checkpoint at"):
    _config(str(missing))
  assert not missing.exists()


def test_without_model_given_every_model_field_held_is_compared(checkpoint):
  c = RunConfig(init_from=checkpoint, data=DataConfig(seq_len=32))
  with pytest.raises(ValueError, match=r"disagrees with init_from=.*model_given"):
    resolve.resolve(c, log=lambda *a: None)
  built = resolve.resolve(c, model_given=["pos_encoding"], log=lambda *a: None)
  assert built.model.pos_encoding == "rove" and built.model.n_layer == 2


def test_an_export_of_the_rove_run_starts_a_run_with_its_model_and_tokenizer(straight, tmp_path):
  from rove_jax.train import export

  workdir, result = straight
  export.export_run(str(workdir), str(tmp_path / "export"), report=lambda *a: None)
  c = _config(str(tmp_path / "export"), rove=False)
  assert c.model.pos_encoding == "rove"  # the export's own, now
  assert c.data.tokenizer == str(tmp_path / "export" / "tokenizer.json")
  first = training.train(
    _config(str(tmp_path / "export"), rove=False, run_steps=1),
    str(tmp_path / "run"),
    devices=ONE,
    log=lambda *a: None,
  )
  _assert_bitwise(_named(first.params), _named(result.params))


def test_rove_train_replaces_the_config_files_model_and_refuses_a_shape_flag(checkpoint, tmp_path):
  import subprocess
  import sys

  from tests.conftest import subprocess_env

  cmd = [
    sys.executable,
    str(ROOT / "train.py"),
    "--config",
    "smoke",
    f"--config.init_from={checkpoint}",
    "--config.model.pos_encoding=rove",
    "--config.data.max_files=20",
    "--config.data.val_fraction=0.25",
    "--config.data.batch_size=4",
    "--config.data.seq_len=32",
    "--config.steps=2",
    "--config.optim.warmup_steps=1",
    "--config.log_every=1",
    "--config.eval_every=2",
    "--config.eval_batches=1",
    "--config.sample_tokens=0",
    "--config.progress=False",
    "--config.tracking=none",
  ]
  bad = subprocess.run(
    cmd + ["--workdir", str(tmp_path / "bad"), "--config.model.d_model=64"],
    capture_output=True,
    text=True,
    timeout=300,
    env=subprocess_env(1),
  )
  assert bad.returncode == 2, bad.stderr
  assert "model.d_model=64 disagrees with init_from=" in bad.stderr.strip().splitlines()[-1]
  assert not (tmp_path / "bad").exists()
  ok = subprocess.run(
    cmd + ["--workdir", str(tmp_path / "ok")],
    capture_output=True,
    text=True,
    timeout=300,
    env=subprocess_env(1),
  )
  assert ok.returncode == 0, ok.stderr[-3000:]
  assert "pos_encoding rope -> rove" in ok.stderr
  losses = _losses(tmp_path / "ok")
  assert len(losses) == 2 and all(np.isfinite(losses))


def test_init_from_a_bucket_reads_the_model_and_its_tokenizer(checkpoint, gcs_bucket):
  from rove_jax.storage import paths
  from rove_jax.train import init_from

  remote = paths.join(gcs_bucket, "llama")
  for name in ("config.json", "model.safetensors", "tokenizer.json"):
    paths.write_atomic(paths.join(remote, name), (pathlib.Path(checkpoint) / name).read_bytes())
  c = _config(remote)
  assert c.data.tokenizer == paths.join(remote, "tokenizer.json")
  local = tokenization.get_tokenizer(str(pathlib.Path(checkpoint) / "tokenizer.json"))
  assert tokenization.get_tokenizer(c.data.tokenizer).fingerprint == local.fingerprint
  _, want = pretrained.load(checkpoint)
  _assert_bitwise(_named(init_from.load_params(c, None, log=lambda *a: None)), _named(want))


def test_a_run_config_built_elsewhere_must_hold_the_checkpoints_model(checkpoint):
  import dataclasses

  c = _config(checkpoint)
  assert resolve.resolve(c) is c
  wider = dataclasses.replace(c, model=dataclasses.replace(c.model, d_ff=64))
  with pytest.raises(ValueError, match=r"model\.d_ff=64 disagrees with init_from="):
    resolve.resolve(wider)


def _llama_copy(directory: pathlib.Path, checkpoint: str) -> pathlib.Path:
  directory.mkdir()
  for name in ("config.json", "model.safetensors", "tokenizer.json"):
    shutil.copy(pathlib.Path(checkpoint) / name, directory / name)
  return directory


def _damage_header_length(path: pathlib.Path) -> None:
  data = bytearray(path.read_bytes())
  data[:8] = (2**60).to_bytes(8, "little")
  path.write_bytes(bytes(data))


def test_a_damaged_safetensors_file_is_refused_when_the_config_is_built(checkpoint, tmp_path):
  """Before the data is prepared and before any random init: at resolve.resolve."""
  model = _llama_copy(tmp_path / "model", checkpoint)
  _damage_header_length(model / "model.safetensors")
  with pytest.raises(
    ValueError,
    match=r"^init_from=\S+: \S+model\.safetensors is not a valid "
    r"safetensors file: its header length 1152921504606846976",
  ):
    _config(str(model))
  (model / "model.safetensors").write_bytes((LLAMA / "model.safetensors").read_bytes())
  (model / "model.safetensors.index.json").write_text("[]")  # the single file wins: ignored
  assert _config(str(model)).model.n_layer == 2


def test_a_tokenizer_file_outside_the_checkpoint_is_refused(checkpoint, tmp_path):
  model = _llama_copy(tmp_path / "model", checkpoint)
  hf = json.loads((model / "config.json").read_text())
  for file, says in (
    ("/etc/passwd", "is an absolute path"),
    ("../tokenizer.json", "leads outside it"),
  ):
    hf["rove_jax_run"] = {"tokenizer": {"file": file}}
    (model / "config.json").write_text(json.dumps(hf))
    with pytest.raises(
      ValueError,
      match=r"^init_from=\S+: rove_jax_run\.tokenizer\.file "
      + repr(file).replace(".", r"\.")
      + " "
      + says,
    ):
      _config(str(model))


def test_rove_train_refuses_a_damaged_init_from_with_one_line_and_exit_2(checkpoint, tmp_path):
  import subprocess
  import sys

  from tests.conftest import subprocess_env

  model = _llama_copy(tmp_path / "model", checkpoint)
  _damage_header_length(model / "model.safetensors")
  r = subprocess.run(
    [
      sys.executable,
      str(ROOT / "train.py"),
      "--config",
      "smoke",
      f"--config.init_from={model}",
      "--workdir",
      str(tmp_path / "run"),
    ],
    capture_output=True,
    text=True,
    timeout=300,
    env=subprocess_env(1),
  )
  assert r.returncode == 2, r.stderr[-3000:]
  assert (
    r.stderr.strip()
    .splitlines()[-1]
    .startswith(
      f"error: init_from={model}: {model / 'model.safetensors'} is not a valid safetensors file"
    )
  ), r.stderr[-3000:]
  assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_a_resolved_config_is_not_read_again(checkpoint, tmp_path, monkeypatch):
  """rove-train resolves its config (reading init_from's checkpoint) before jax.distributed
  starts and trains it with resolved=True: the checkpoint's config is read once, not twice."""
  c = _config(checkpoint, run_steps=1)  # resolved, as rove-train's load does
  real, reads = pretrained.inspect, []
  monkeypatch.setattr(pretrained, "inspect", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
  first = training.train(c, str(tmp_path / "a"), devices=ONE, log=lambda *a: None, resolved=True)
  assert reads == []
  _assert_bitwise(_named(first.params), _named(pretrained.load(checkpoint)[1]))  # lr 0 at step 1
  training.train(c, str(tmp_path / "b"), devices=ONE, log=lambda *a: None)
  assert reads == [checkpoint]


def test_resolved_true_refuses_a_config_resolve_did_not_return(tmp_path):
  from rove_jax.aot import compile as aot

  c = RunConfig(tracking="none")  # no tokenizer: resolve gives it "bytes"
  for fn, name in (
    (lambda: training.train(c, str(tmp_path), resolved=True), "train"),
    (lambda: aot.compile_job(c, "cpu:1", resolved=True), "compile_job"),
  ):
    with pytest.raises(ValueError, match=rf"^{name}\(resolved=True\) takes a config as "):
      fn()
  assert not any(tmp_path.iterdir())  # nothing written


def test_a_training_workdir_as_init_from_points_to_rove_export(trained_run):
  """A newcomer's first try: init_from names a rove-train workdir, which holds checkpoints,
  not a model directory. One line says how to make one of it."""
  with pytest.raises(ValueError) as e:
    resolve.command_line(RunConfig(tracking="none"), [("init_from", str(trained_run))])
  message = str(e.value)
  assert message.startswith(f"init_from={trained_run}: {trained_run} holds no model.safetensors")
  assert f"rove-export --workdir {trained_run} --out DIR" in message and "\n" not in message
