"""A resume on other data than the run began with is an error, never a silent continuation:
a prepared dataset re-prepared from other text of the same token count, or a text corpus edited
between two starts (checkpoint metadata's data_identity against `Data.identity`). With
data.allow_changed=True the run continues on the new data and says so."""

import pathlib
import shutil

import jax
import pytest

from rove_jax import data
from rove_jax.train import config_schema
from rove_jax.train import loop as training
from rove_jax.train import resume
from tests.conftest import small_config

ONE = jax.devices()[:1]


def swap_x_and_y(directory: pathlib.Path) -> None:
  """Other text with the same byte count: every x becomes y and every y x."""
  for f in directory.iterdir():
    f.write_text(f.read_text().translate(str.maketrans("xy", "yx")))


def run(c, workdir, out=None):
  return training.train(c, str(workdir), devices=ONE,
                        log=(lambda *a: None) if out is None else out.append)


@pytest.mark.slow
def test_a_re_prepared_dataset_stops_the_resume_unless_allowed(tmp_path):
  c = small_config(tmp_path, steps=4)
  corpus = pathlib.Path(c.data.path)
  prepared = tmp_path / "prepared"
  data.prepare_dataset(config_schema.build(c).data.corpus(), "bytes", prepared,
                       tokens_per_shard=3000, progress=False)
  c.data.source, c.data.path, c.run_steps = "prepared", str(prepared), 2
  run(c, tmp_path / "run")
  first = data.prepare(config_schema.build(c).data.corpus(), "bytes",
                       workdir=str(tmp_path / "probe")).identity
  swap_x_and_y(corpus)
  shutil.rmtree(prepared)
  raw = config_schema.build(small_config(tmp_path / "raw", **{"data.path": str(corpus)})
                            ).data.corpus()
  data.prepare_dataset(raw, "bytes", prepared, tokens_per_shard=3000, progress=False)
  second = data.prepare(config_schema.build(c).data.corpus(), "bytes",
                        workdir=str(tmp_path / "probe")).identity
  assert first["manifest_sha256"] != second["manifest_sha256"]
  c.run_steps = None
  with pytest.raises(resume.IncompatibleRun) as info:
    run(c, tmp_path / "run")
  message = str(info.value)
  assert "step 2" in message and str(prepared) in message and "re-prepared" in message
  assert "--config.data.allow_changed=True" in message
  c.data.allow_changed = True
  out = []
  summary = run(c, tmp_path / "run", out)
  assert summary.start_step == 2 and summary.step == 4
  assert any("continuing on the new data" in line for line in out), out


def test_an_edited_text_corpus_stops_the_resume(tmp_path):
  c = small_config(tmp_path, steps=4, run_steps=2)
  run(c, tmp_path / "run")
  swap_x_and_y(pathlib.Path(c.data.path))
  c.run_steps = None
  with pytest.raises(resume.IncompatibleRun, match="training data changed since the "
                                                   "checkpoint at step 2"):
    run(c, tmp_path / "run")
