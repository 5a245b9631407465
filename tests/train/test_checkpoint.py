"""checkpoint.py: restoring a finished run (read_run / restore_params), the fallback past an
unreadable newest checkpoint, and the error for a checkpoint of another parameter layout."""

import os
import pathlib
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rove_jax.evaluation import scoring
from rove_jax.nn.model import abstract_params
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import run_reader
from rove_jax.train.run_config import RunConfig


def model_params(meta):
  return abstract_params(GPTConfig.from_dict(meta["model"]))


def raw_entries(workdir, step) -> dict:
  """{entry: numpy array} of a checkpoint's state, read with orbax directly: the reference."""
  manager = ocp.CheckpointManager(
    os.path.join(workdir, "checkpoints"), item_names=("state", "data", "meta")
  )
  state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  return {k: np.asarray(v) for k, v in state["state"].items()}


def params_as_entries(params) -> dict:
  return {ckpt_lib.PARAMS + k: np.asarray(v) for k, v in ckpt_lib.to_flat(params).items()}


@pytest.fixture
def run_copy(trained_run, tmp_path) -> pathlib.Path:
  """A private copy of the session's trained run (checkpoints at steps 4 and 6)."""
  dst = tmp_path / "run"
  shutil.copytree(trained_run, dst)
  return dst


def truncate_state(workdir, step):
  for f in (pathlib.Path(workdir) / "checkpoints" / str(step) / "state").rglob("*"):
    if f.is_file() and f.stat().st_size > 0:
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])


def test_read_run_restores_the_newest_checkpoint(trained_run):
  step, params, meta = run_reader.read_run(str(trained_run), model_params)
  assert step == 6 and meta["step"] == 6 and meta["config"]["data"]["seq_len"] == 64
  raw = raw_entries(trained_run, 6)
  got = params_as_entries(params)
  assert set(got) == {k for k in raw if k.startswith("params.")}
  chex.assert_trees_all_close(got, {k: raw[k] for k in got}, rtol=0, atol=0)
  # restore_params: the same, for a caller that knows the model already
  step2, params2 = run_reader.restore_params(str(trained_run), model_params(meta))
  assert step2 == 6
  chex.assert_trees_all_close(params2, params, rtol=0, atol=0)
  # and load_run builds the model config from the same metadata
  run = scoring.load_run(str(trained_run))
  assert run.step == 6 and run.model_config == GPTConfig.from_dict(meta["model"])
  assert run.train_len == 64
  chex.assert_trees_all_close(run.params, params, rtol=0, atol=0)
  assert "model" not in meta["config"]  # the model config is stored once, under "model"


def test_load_for_inference_restores_the_checkpoint_bit_for_bit(trained_run):
  """What rove-eval and rove-export restore (run_reader.load_for_inference): the newest
  checkpoint's parameters as orbax stored them, the model config and training length of its
  metadata, and the tokenizer it was trained with; rove-eval's Run holds the same."""
  restored = run_reader.load_for_inference(str(trained_run))
  raw = raw_entries(trained_run, 6)
  got = params_as_entries(restored.params)
  assert restored.step == 6 and set(got) == {k for k in raw if k.startswith("params.")}
  chex.assert_trees_all_close(got, {k: raw[k] for k in got}, rtol=0, atol=0)
  _, _, meta = run_reader.read_run(str(trained_run), model_params)
  assert restored.meta == meta and restored.workdir == str(trained_run)
  assert restored.model_config == GPTConfig.from_dict(meta["model"]) and restored.train_len == 64
  assert restored.tokenizer.fingerprint == meta["tokenizer"]["fingerprint"]
  run = scoring.load_run(str(trained_run))
  assert (run.step, run.model_config, run.train_len) == (6, restored.model_config, 64)
  assert run.tokenizer.fingerprint == restored.tokenizer.fingerprint
  chex.assert_trees_all_close(run.params, restored.params, rtol=0, atol=0)


def test_load_run_reads_back_the_run_config_it_was_trained_with(trained_run):
  """The metadata holds the model config once ("model") and the rest of the run config
  ("config"); evaluation reads them back as the RunConfig the run was built with."""
  step, params, meta = run_reader.read_run(str(trained_run), model_params)
  assert "model" not in meta["config"]
  run = scoring.load_run(str(trained_run))
  assert run.config == RunConfig.from_metadata(meta)
  assert run.model_config == GPTConfig.from_dict(meta["model"]) == run.config.model
  assert run.config.to_dict() == {**meta["config"], "model": meta["model"]}


def test_read_run_falls_back_past_an_unreadable_newest_checkpoint(run_copy):
  want = params_as_entries(run_reader.read_run(str(run_copy), model_params)[1])  # step 6
  step4 = {k: v for k, v in raw_entries(run_copy, 4).items() if k in want}
  assert any(not np.array_equal(step4[k], want[k]) for k in want)  # 4 and 6 differ
  truncate_state(run_copy, 6)
  out = []
  step, params, meta = run_reader.read_run(str(run_copy), model_params, report=out.append)
  assert step == 4 and meta["step"] == 4
  assert len(out) == 1 and "checkpoint at step 6" in out[0] and "cannot be restored" in out[0]
  chex.assert_trees_all_close(params_as_entries(params), step4, rtol=0, atol=0)
  # evaluation reads only: the unreadable checkpoint stays where training will report it
  assert (run_copy / "checkpoints" / "6").is_dir()
  assert not (run_copy / "checkpoints_unreadable").exists()
  truncate_state(run_copy, 4)
  with pytest.raises(ValueError, match=r"none of the checkpoints \[4, 6\]"):
    run_reader.read_run(str(run_copy), model_params, report=out.append)


def renamed_layout(meta):
  """The model's parameter tree with one attention projection under another name: what a
  checkpoint of an older layout (e.g. separate wq/wk/wv against a fused projection) looks like
  from the other side."""
  flat = ckpt_lib.to_flat(model_params(meta))
  old = next(k for k in sorted(flat) if ".attn." in k)
  renamed = {(k.replace(".attn.", ".attn.renamed_") if k == old else k): v for k, v in flat.items()}
  return renamed


def test_a_checkpoint_of_another_layout_is_an_error_naming_the_entries(run_copy):
  with pytest.raises(ckpt_lib.LayoutError) as info:
    run_reader.read_run(str(run_copy), renamed_layout, report=pytest.fail)
  message = str(info.value)
  flat = ckpt_lib.to_flat(model_params(run_reader.read_run(str(run_copy), model_params)[2]))
  old = next(k for k in sorted(flat) if ".attn." in k)
  assert "step 6" in message and "older" in message and "layout" in message
  assert "params." + old in message  # unexpected: the checkpoint has it, the model not
  assert "params." + old.replace(".attn.", ".attn.renamed_") in message  # missing
  assert isinstance(info.value, ValueError)  # rove-eval reports it as an error, exit 2
  # nothing was moved aside: both checkpoints are still there
  assert sorted(os.listdir(run_copy / "checkpoints")) >= ["4", "6"]


def test_training_resume_with_another_layout_raises_and_quarantines_nothing(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  old = {
    "params.attn.wq": jnp.ones((2, 2)),
    "params.attn.wk": jnp.ones((2, 2)),
    "params.attn.wv": jnp.ones((2, 2)),
    "step": jnp.asarray(3, jnp.int32),
  }
  ck.save(3, old, {}, {"step": 3})  # a state's step is its checkpoint's (check_step)
  new = {
    "params.attn.wqkv": jax.ShapeDtypeStruct((2, 6), jnp.float32),
    "step": jax.ShapeDtypeStruct((), jnp.int32),
  }
  names = r"\[params.attn.wk, params.attn.wq, params.attn.wv\]"
  with pytest.raises(
    ckpt_lib.LayoutError,
    match=r"lacks 1 entries the model needs "
    r"\[params.attn.wqkv\] and has 3 the model does not know " + names,
  ):
    ck.restore_latest(new, report=pytest.fail)
  assert ck.steps() == [3] and not (tmp_path / "checkpoints_unreadable").exists()
  # the same names restore (the check does not reject a good checkpoint)
  same = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), old)
  step, state, _, meta = ck.restore_latest(same, report=pytest.fail)
  assert step == 3 and meta["step"] == 3 and sorted(meta) == ["integrity", "step"]
  assert sorted(meta["integrity"]["state"]) == sorted(old)  # a checksum for every array
  chex.assert_trees_all_close(state, old)
  ck.close()


def test_missing_workdir_or_checkpoints_are_clear_errors(tmp_path):
  with pytest.raises(ValueError, match="does not exist"):
    run_reader.read_run(str(tmp_path / "nope"), model_params)
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="no checkpoints/ directory"):
    run_reader.read_run(str(tmp_path / "empty"), model_params)
  (tmp_path / "empty" / "checkpoints").mkdir()
  with pytest.raises(ValueError, match="no finished checkpoint"):
    run_reader.read_run(str(tmp_path / "empty"), model_params)


def test_a_checkpoint_copied_under_another_step_is_moved_aside(tmp_path):
  """cp -r checkpoints/10 checkpoints/30: its checksums hold, but its state, iterator and
  schedule are step 10's. The restore treats it as unreadable (moved aside with the reason)
  and resumes from the real step 10; readers skip it the same way."""
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  state = {"params.w": jnp.arange(4.0), "step": jnp.asarray(10, jnp.int32)}
  ck.save(10, state, {"position": 10}, {"step": 10})
  ck.close()
  shutil.copytree(tmp_path / "checkpoints" / "10", tmp_path / "checkpoints" / "30")
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  assert ck.steps() == [10, 30]
  out = []
  assert ck.newest_meta(report=out.append)[0] == 10
  assert "step 30" in out[0] and "metadata records step 10" in out[0]
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
  out = []
  step, restored, data_state, meta = ck.restore_latest(abstract, report=out.append)
  assert step == 10 and meta["step"] == 10 and data_state == {"position": 10}
  chex.assert_trees_all_close(restored, state)
  assert len(out) == 1 and "step 30" in out[0] and "another step number" in out[0]
  assert ck.steps() == [10]
  moved = os.listdir(tmp_path / "checkpoints_unreadable")
  assert len(moved) == 1 and moved[0].startswith("30-")
  reason = (tmp_path / "checkpoints_unreadable" / moved[0] / ckpt_lib.REASON_FILE).read_text()
  assert "directory says step 30" in reason and "records step 10" in reason
  ck.close()


def test_check_step_compares_metadata_and_state_with_the_directory():
  ckpt_lib.check_step(7, {"step": 7}, {"step": np.int32(7)})
  with pytest.raises(ckpt_lib.CorruptCheckpoint, match="state records step 5"):
    ckpt_lib.check_step(7, {"step": 7}, {"step": np.int32(5)})
