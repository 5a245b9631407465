"""A resume on other data than the run began with is an error, never a silent continuation:
a prepared dataset re-prepared from other text of the same token count, or a text corpus edited
between two starts (checkpoint metadata's data_identity against `Data.identity`). With
data.allow_changed=True the run continues on the new data and says so. A prepared shard edited
in place (same size) stops the resume until it is prepared again; a damaged local copy of a
gs:// shard is fetched again; two processes that read other data at one path stop before step
1."""

import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest

from rove_jax import data
from rove_jax.train import loop as training
from rove_jax.train import overrides, resume
from tests.conftest import free_port, small_config, subprocess_env

ONE = jax.devices()[:1]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def swap_x_and_y(directory: pathlib.Path) -> None:
  """Other text with the same byte count: every x becomes y and every y x."""
  for f in directory.iterdir():
    f.write_text(f.read_text().translate(str.maketrans("xy", "yx")))


def run(c, workdir, out=None):
  return training.train(
    c, str(workdir), devices=ONE, log=(lambda *a: None) if out is None else out.append
  )


@pytest.mark.slow
def test_a_re_prepared_dataset_stops_the_resume_unless_allowed(tmp_path):
  c = small_config(tmp_path, steps=4)
  corpus = pathlib.Path(c.data.path)
  prepared = tmp_path / "prepared"
  data.prepare_dataset(c.data.corpus(), "bytes", prepared, tokens_per_shard=3000, progress=False)
  c = overrides.apply(c, {"data.source": "prepared", "data.path": str(prepared), "run_steps": 2})
  run(c, tmp_path / "run")
  first = data.prepare(c.data.corpus(), "bytes", workdir=str(tmp_path / "probe")).identity
  swap_x_and_y(corpus)
  shutil.rmtree(prepared)
  raw = small_config(tmp_path / "raw", **{"data.path": str(corpus)}).data.corpus()
  data.prepare_dataset(raw, "bytes", prepared, tokens_per_shard=3000, progress=False)
  second = data.prepare(c.data.corpus(), "bytes", workdir=str(tmp_path / "probe")).identity
  assert first["manifest_sha256"] != second["manifest_sha256"]
  c = overrides.apply(c, {"run_steps": None})
  with pytest.raises(resume.IncompatibleRun) as info:
    run(c, tmp_path / "run")
  message = str(info.value)
  assert "step 2" in message and str(prepared) in message and "re-prepared" in message
  assert "--config.data.allow_changed=True" in message
  c = overrides.apply(c, {"data.allow_changed": True})
  out = []
  summary = run(c, tmp_path / "run", out)
  assert summary.start_step == 2 and summary.step == 4
  assert any("continuing on the new data" in line for line in out), out


def test_an_edited_text_corpus_stops_the_resume(tmp_path):
  c = small_config(tmp_path, steps=4, run_steps=2)
  run(c, tmp_path / "run")
  swap_x_and_y(pathlib.Path(c.data.path))
  c = overrides.apply(c, {"run_steps": None})
  with pytest.raises(
    resume.IncompatibleRun, match="training data changed since the checkpoint at step 2"
  ):
    run(c, tmp_path / "run")


def edit_in_place(file: pathlib.Path) -> None:
  """One token of the shard changed to another, its size and modification time kept."""
  st = file.stat()
  with open(file, "r+b") as f:
    first = f.read(1)
    f.seek(0)
    f.write(bytes([first[0] ^ 1]))
  os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))


def steps(workdir) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_a_shard_edited_in_place_stops_the_resume_until_prepared_again(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
  c = small_config(tmp_path, steps=4)
  prepared, corpus = tmp_path / "prepared", c.data.corpus()
  manifest = data.prepare_dataset(corpus, "bytes", prepared, tokens_per_shard=3000, progress=False)
  c = overrides.apply(c, {"data.source": "prepared", "data.path": str(prepared), "run_steps": 2})
  run(c, tmp_path / "run")
  shard = prepared / manifest["splits"]["train"]["shards"][1]["file"]
  good = shard.read_bytes()
  edit_in_place(shard)
  c = overrides.apply(c, {"run_steps": None})
  with pytest.raises(data.prepared.DamagedDataset) as info:
    run(c, tmp_path / "run")
  message = str(info.value)
  assert message.startswith(f"shard {shard} does not match its sha256") and "\n" not in message
  assert "rove-prepare" in message and "--config.data.allow_changed=True" in message
  assert steps(tmp_path / "run") == [2]  # stopped before any step
  # Rerunning the command that prepared it rewrites the shard; the run then resumes.
  data.prepare_dataset(corpus, "bytes", prepared, tokens_per_shard=3000, progress=False)
  assert shard.read_bytes() == good
  summary = run(c, tmp_path / "run")
  assert summary.start_step == 2 and summary.step == 4


@pytest.mark.slow
def test_an_edited_local_copy_of_a_gs_shard_is_fetched_again_on_resume(
  tmp_path, gcs_bucket, monkeypatch, capsys
):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
  c = small_config(tmp_path, steps=4)
  out = f"{gcs_bucket}/ds"
  manifest = data.prepare_dataset(
    c.data.corpus(), "bytes", out, tokens_per_shard=3000, progress=False
  )
  c = overrides.apply(c, {"data.source": "prepared", "data.path": out, "run_steps": 2})
  run(c, tmp_path / "run")
  name = manifest["splits"]["train"]["shards"][0]["file"]
  (copy,) = (tmp_path / "xdg-cache" / "rove_jax" / "remote").rglob(name)
  intact = copy.read_bytes()
  edit_in_place(copy)
  c = overrides.apply(c, {"run_steps": None})
  capsys.readouterr()
  summary = run(c, tmp_path / "run")
  assert summary.start_step == 2 and summary.step == 4 and copy.read_bytes() == intact
  assert f"the local copy {copy} of {out}/{name} does not match" in capsys.readouterr().err


@pytest.mark.slow
def test_two_processes_reading_other_data_at_one_path_stop_before_step_1(tmp_path):
  """Each process's data.path=ds (relative: the same config) names another dataset of the same
  size, one corpus with x and y swapped; both stop with exit 2 naming process 1."""
  corpus = pathlib.Path(small_config(tmp_path).data.path)
  for i in range(2):
    if i:
      swap_x_and_y(corpus)
    (tmp_path / f"host{i}").mkdir()
    data.prepare_dataset(
      data.Corpus("text", str(corpus)),
      "bytes",
      tmp_path / f"host{i}" / "ds",
      tokens_per_shard=3000,
      progress=False,
    )
  args = [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.model.d_ff=64",
    "--config.model.max_len=32",
    "--config.data.source=prepared",
    "--config.data.path=ds",
    "--config.data.seq_len=32",
    "--config.data.batch_size=4",
    "--config.steps=2",
    "--config.progress=False",
    "--config.sample_tokens=0",
    "--config.optim.warmup_steps=1",
  ]
  port = free_port()
  env = subprocess_env(devices=1, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path / "cache"))
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(ROOT / "configs" / "tiny.py"),
        "--workdir",
        str(tmp_path / "run"),
        *args,
        f"--coordinator_address=localhost:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      env=env,
      cwd=tmp_path / f"host{i}",
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=240)[0] for p in procs]
  for p, o in zip(procs, outs):
    assert p.returncode == 2, o[-3000:]
    (line,) = [l for l in o.splitlines() if l.startswith("error:")]
    assert "processes [1] of 2 read other data than process 0" in line, line
    assert "manifest_sha256" in line and "nothing was trained" in line
  assert not (tmp_path / "run" / "checkpoints").exists() or steps(tmp_path / "run") == []
