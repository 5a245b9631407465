"""Exports, parameter files and evaluation reports through the path layer, on a local
directory and on a bucket of the session's GCS API server (tests/gcs_server.py: a real
server, nothing mocked): parameter files written to gs:// read back bit for bit (single and
sharded), an export loaded from gs:// gives the local export's logits, a transformers GPT-2
checkpoint on gs:// reproduces transformers' logits, a report written to gs:// holds what the
local write holds (and a failed upload leaves the previous report.json whole), and rove-export
writes to gs:// and fails in one line, exit 1, for an --out it cannot write (checked before the
checkpoint is read) or a gs:// path without gcsfs.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rove_jax.cli import export as export_cli
from rove_jax.evaluation import report_files
from rove_jax.nn import hf_gpt2, param_files, pretrained
from rove_jax.nn.model_config import GPTConfig
from rove_jax.storage import paths
from tests import gcs_server
from tests.cli.test_eval_errors import _report
from tests.conftest import subprocess_env
from tests.nn.test_hf_gpt2 import (
  DATA,
  assert_logits_close,
  assert_same_params,
  learned,
  logits_of,
  random_params,
  reference,
  write_run,
)

TOKENIZER = {
  "spec": "bytes",
  "name": "bytes",
  "vocab_size": 257,
  "eot_id": 47,
  "fingerprint": "bytes-v1",
}
PROMPT = np.array([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]], np.int32)


def rove_config() -> GPTConfig:
  return GPTConfig(vocab_size=40, n_layer=1, n_head=2, d_model=16, d_ff=24, max_len=16)


def files_under(root: str) -> dict:
  """{relative path: bytes} of every file under a local or gs:// directory."""
  return {
    rel: paths.read_bytes(paths.join(root, *rel.split("/"))) for rel in paths.walk_files(root)
  }


def assert_same_tensors(got: dict, want: dict):
  assert sorted(got) == sorted(want)
  for name in want:
    assert got[name].dtype == want[name].dtype, name
    assert np.array_equal(got[name], want[name]), name


# ------------------------------------------------------------------------- parameter files


def test_parameter_files_round_trip_through_gcs_bit_for_bit(gcs_bucket, tmp_path):
  config = rove_config()
  tensors = param_files.named(random_params(config, seed=5))
  hf = {"model_type": "test", "n": 3}
  out = paths.join(gcs_bucket, "ckpt")
  written = param_files.write_checkpoint(out, tensors, hf, metadata={"format": "rove_jax"})
  assert written == {"config": f"{out}/config.json", "weights": f"{out}/model.safetensors"}
  assert gcs_server.objects(gcs_bucket) == ["ckpt/config.json", "ckpt/model.safetensors"]
  files, config_path = param_files.locate(out)
  assert (files, config_path) == ([written["weights"]], written["config"])
  assert param_files.read_config(out) == hf
  assert_same_tensors(param_files.read_tensors(files), tensors)
  # the same bytes as the local writer's file (one serialisation, two backends)
  local = param_files.write_checkpoint(str(tmp_path), tensors, hf, metadata={"format": "rove_jax"})
  assert files_under(out) == files_under(str(tmp_path))
  assert local["weights"] == str(tmp_path / "model.safetensors")


def test_a_sharded_checkpoint_on_gcs_reads_like_its_single_file(gcs_bucket):
  from safetensors.numpy import save

  tensors = param_files.named(random_params(rove_config(), seed=6))
  names = sorted(tensors)
  shards = {
    "model-00001-of-00002.safetensors": names[::2],
    "model-00002-of-00002.safetensors": names[1::2],
  }
  root = paths.join(gcs_bucket, "sharded")
  for shard, members in shards.items():
    paths.write_atomic(paths.join(root, shard), save({n: tensors[n] for n in members}))
  paths.write_atomic(
    paths.join(root, param_files.WEIGHTS_INDEX),
    json.dumps({"weight_map": {n: shard for shard, members in shards.items() for n in members}}),
  )
  files, _ = param_files.locate(root, need_config=False)
  assert files == [paths.join(root, s) for s in sorted(shards)]
  assert_same_tensors(param_files.read_tensors(files), tensors)
  paths.remove(paths.join(root, "model-00002-of-00002.safetensors"))
  with pytest.raises(FileNotFoundError, match="names shards that are not there"):
    param_files.locate(root, need_config=False)


@pytest.mark.parametrize("format", ["gpt2", "rove_jax"])
def test_an_export_loaded_from_gcs_gives_the_local_exports_logits(gcs_bucket, tmp_path, format):
  config = learned() if format == "gpt2" else rove_config()
  params = random_params(config, seed=7)
  remote = paths.join(gcs_bucket, "exports", "tiny")
  assert pretrained.save(remote, config, params)["format"] == format
  pretrained.save(tmp_path, config, params)
  assert files_under(remote) == files_under(str(tmp_path))  # identical files
  got_config, got_params = pretrained.load(remote)
  want_config, want_params = pretrained.load(tmp_path)
  assert got_config == want_config == config
  assert_same_params(got_params, want_params)
  np.testing.assert_array_equal(
    logits_of(got_config, got_params, PROMPT[:, :8]),
    logits_of(want_config, want_params, PROMPT[:, :8]),
  )
  # a .safetensors file on gs:// with the config.json beside it
  assert pretrained.load(paths.join(remote, "model.safetensors"))[0] == config


def test_a_transformers_gpt2_checkpoint_on_gcs_reproduces_its_logits(gcs_bucket):
  remote = paths.join(gcs_bucket, "gpt2_tiny")
  paths.copy_tree(str(DATA), remote)
  config, params = hf_gpt2.load_gpt2(remote)
  tokens, want = reference()
  assert_logits_close(logits_of(config, params, tokens), want)


def test_a_missing_gcs_checkpoint_names_where_it_looked(gcs_bucket):
  with pytest.raises(FileNotFoundError, match=f"no checkpoint at {gcs_bucket}/nope"):
    pretrained.load(paths.join(gcs_bucket, "nope"))


# ------------------------------------------------------------------------------- reports


def test_a_report_on_gcs_holds_what_the_local_write_holds(gcs_bucket, tmp_path):
  out = paths.join(gcs_bucket, "eval")
  # an earlier report's figure1 (not drawn this time: removed) and a file that is not ours
  paths.write_atomic(paths.join(out, "figure1_mixer.png"), b"an older report's figure")
  paths.write_atomic(paths.join(out, "notes.png"), b"not ours")
  (tmp_path / "figure1_mixer.png").write_bytes(b"an older report's figure")
  (tmp_path / "notes.png").write_bytes(b"not ours")
  remote = report_files.write(_report(), out)
  local = report_files.write(_report(), str(tmp_path))
  assert remote == {key: paths.join(out, os.path.basename(p)) for key, p in local.items()}
  got, want = files_under(out), files_under(str(tmp_path))
  assert sorted(got) == [
    "icl_accuracy.png",
    "notes.png",
    "perplexity_vs_length.png",
    "report.json",
    "report.md",
    "ruler_nll.png",
  ]
  assert got == want  # every object holds the local file's bytes
  assert json.loads(got["report.json"]) == _report()
  assert got["report.md"].decode().strip().splitlines()[-1] == (
    "Plots: perplexity_vs_length.png, ruler_nll.png, icl_accuracy.png"
  )


def test_a_failed_upload_leaves_the_previous_report_json_whole(gcs_bucket, monkeypatch):
  out = paths.join(gcs_bucket, "eval")
  report_files.write(_report(), out)
  before = files_under(out)
  original = report_files._write_data

  def fail_at_json(f, data, path):
    if path.endswith("report.json"):
      original(f, data[:10], path)
      raise OSError(28, "No space left on device")
    original(f, data, path)

  monkeypatch.setattr(report_files, "_write_data", fail_at_json)
  new = _report(icl=False)
  new["runs"][0]["step"] = 99
  with pytest.raises(OSError, match="No space left"):
    report_files.write(new, out)
  after = files_under(out)
  # report.json is the previous one, whole; its icl plot was not removed (that comes after
  # report.json); only whole objects exist (the guarantee on gs://: no partial object)
  assert after["report.json"] == before["report.json"]
  assert after["icl_accuracy.png"] == before["icl_accuracy.png"]
  assert sorted(after) == sorted(before)


# ---------------------------------------------------------------------------- rove-export


def run_dir(tmp_path, config, seed=8):
  workdir = tmp_path / "run"
  params = random_params(config, seed)
  write_run(str(workdir), config, [(3, params)], TOKENIZER)
  return workdir, params


def test_rove_export_writes_to_gcs(gcs_bucket, tmp_path, capsys):
  config = rove_config()
  workdir, params = run_dir(tmp_path, config)
  out = paths.join(gcs_bucket, "exports", "run")
  assert export_cli.main(["--workdir", str(workdir), "--out", out]) == 0
  assert capsys.readouterr().out.strip() == (
    f"exported step 3 of {workdir} in rove_jax format to {out}"
  )
  assert gcs_server.objects(gcs_bucket) == [
    "exports/run/config.json",
    "exports/run/model.safetensors",
  ]  # no probe left
  got_config, got_params = pretrained.load(out)
  assert got_config == config
  assert_same_params(got_params, params)
  assert json.loads(paths.read_text(paths.join(out, "config.json")))["rove_jax_run"] == {
    "step": 3,
    "workdir": "run",
    "tokenizer": TOKENIZER,
  }
  assert export_cli.main(["--workdir", str(workdir), "--out", out]) == 2  # no silent overwrite
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("rove-export: error: ")
  assert "--overwrite" in err


def one_error_line(capsys) -> str:
  err = capsys.readouterr().err
  assert "Traceback" not in err and err.endswith("\n")
  return err.splitlines()[-1]


def test_rove_export_to_an_existing_file_exits_1_in_one_line_before_reading(tmp_path, capsys):
  workdir = tmp_path / "empty_run"  # no checkpoints: reading it would be exit 2
  workdir.mkdir()
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  assert export_cli.main(["--workdir", str(workdir), "--out", str(a_file)]) == 1
  err = capsys.readouterr().err
  assert err == (
    f"rove-export: error: --out {a_file} is an existing file, not a directory; "
    f"give a directory for the export\n"
  )
  assert export_cli.main(["--workdir", str(workdir), "--out", str(a_file / "sub")]) == 1
  line = one_error_line(capsys)
  assert line.startswith(
    f"rove-export: error: cannot create or write the export directory {a_file / 'sub'} ("
  )
  assert line.endswith("); give a writable --out")
  assert a_file.read_text() == "not a directory"


def test_rove_export_to_an_existing_gcs_object_exits_1(gcs_bucket, tmp_path, capsys):
  (tmp_path / "run").mkdir()
  paths.write_atomic(paths.join(gcs_bucket, "taken"), b"an object")
  assert (
    export_cli.main(["--workdir", str(tmp_path / "run"), "--out", paths.join(gcs_bucket, "taken")])
    == 1
  )
  assert one_error_line(capsys) == (
    f"rove-export: error: --out {gcs_bucket}/taken is an "
    f"existing file, not a directory; give a directory for the "
    f"export"
  )


def test_rove_export_to_a_missing_bucket_exits_1_before_reading(gcs_bucket, tmp_path, capsys):
  (tmp_path / "run").mkdir()  # no checkpoints: reading it would be exit 2
  out = gcs_bucket + "-missing/exports/run"
  assert export_cli.main(["--workdir", str(tmp_path / "run"), "--out", out]) == 1
  assert one_error_line(capsys) == (
    f"rove-export: error: cannot create or write the export directory {out} (the bucket "
    f"{gcs_bucket}-missing does not exist or these credentials cannot reach it); give a "
    f"writable --out"
  )


def test_rove_export_to_a_read_only_directory_exits_1_in_one_line(tmp_path, capsys):
  config = learned()
  workdir, _ = run_dir(tmp_path, config)
  out = tmp_path / "read_only"
  out.mkdir()
  out.chmod(0o555)
  try:
    try:
      (out / "probe").write_bytes(b"")
    except PermissionError:
      pass
    else:
      pytest.skip(
        "running as root (with CAP_DAC_OVERRIDE): a 0o555 directory is still "
        "writable, so there is no read-only directory to test against; as root, run "
        "it without that capability: setpriv --inh-caps=-dac_override "
        "--bounding-set=-dac_override python -m pytest ..."
      )
    assert export_cli.main(["--workdir", str(workdir), "--out", str(out)]) == 1
    line = one_error_line(capsys)
    assert line == (
      f"rove-export: error: cannot create or write the export directory {out} "
      f"(Permission denied); give a writable --out"
    )
    assert os.listdir(out) == []
    # a directory the command creates inside it fails the same way, and nothing is left
    assert export_cli.main(["--workdir", str(workdir), "--out", str(out / "a" / "b")]) == 1
    assert "cannot create or write the export directory" in one_error_line(capsys)
    assert os.listdir(out) == []
  finally:
    out.chmod(0o755)


def test_a_failed_export_removes_the_directory_it_created(tmp_path, capsys):
  workdir = tmp_path / "empty_run"
  workdir.mkdir()
  out = tmp_path / "new" / "export"
  assert export_cli.main(["--workdir", str(workdir), "--out", str(out)]) == 2  # no checkpoint
  assert one_error_line(capsys).startswith("rove-export: error: ")
  assert not (tmp_path / "new").exists()  # made by the writability check, then removed


def test_rove_export_without_gcsfs_exits_1_naming_the_extra(tmp_path):
  (tmp_path / "run").mkdir()
  code = (
    "import sys; sys.modules['gcsfs'] = None\n"
    "import importlib.util as u; find = u.find_spec\n"
    "u.find_spec = lambda name, *a: None if name == 'gcsfs' else find(name, *a)\n"
    "from rove_jax.cli import export as export_cli\n"
    "sys.exit(export_cli.main(sys.argv[1:]))\n"
  )
  done = subprocess.run(
    [
      sys.executable,
      "-c",
      code,
      "--workdir",
      str(tmp_path / "run"),
      "--out",
      "gs://bucket/exports/run",
    ],
    capture_output=True,
    text=True,
    env=subprocess_env(),
    timeout=120,
  )
  assert done.returncode == 1, done.stderr
  assert done.stderr == (
    "rove-export: error: --out gs://bucket/exports/run is on Google Cloud "
    "Storage, which needs gcsfs: pip install 'rove_jax[gcs]'\n"
  )
