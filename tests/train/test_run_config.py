"""Config path: config file -> run config -> GPTConfig -> checkpoint metadata -> GPTConfig, the
errors on the way, no JAX backend while building configs, and `rove-train --config NAME`."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import chex
import jax
import numpy as np
import pytest
from absl import app

from rove_jax import scaling
from rove_jax.cli import train as train_cli
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import overrides, resolve, resume, run_config
from rove_jax.train.run_config import RunConfig
from tests.conftest import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]

# rot_dim of the tiny preset is 384 / 6 = 64: LongRoPE takes 32 factors per list.
LONGROPE = {
  "rope_type": "longrope",
  "short_factor": [1.0 + i / 64 for i in range(32)],
  "long_factor": [2.0 + i / 16 for i in range(32)],
  "original_max_position_embeddings": 128,
}


def parse_config_file(path, *args):
  """The RunConfig that `rove-train --config=path --config.x=y ...` runs with."""
  return overrides.apply(overrides.load_file(str(path)), overrides.split(args))


def write_tiny_with_longrope(tmp_path):
  path = tmp_path / "tiny_longrope.py"
  path.write_text(
    textwrap.dedent(f"""
      import dataclasses

      from rove_jax.train.configs import tiny

      def get_config():
        c = tiny.get_config()
        return dataclasses.replace(
            c, model=dataclasses.replace(c.model, rope_scaling={LONGROPE!r}))
      """)
  )
  return path


def test_round_trip_config_file_to_metadata_and_back(tmp_path):
  c = parse_config_file(
    write_tiny_with_longrope(tmp_path),
    "--config.model.rove_layers=(0,2)",
    "--config.model.n_kv_head=2",
  )
  model = c.model
  assert model.rove_layers == (0, 2) and model.n_kv_head == 2
  assert model.rope_scaling == scaling.RopeScaling.from_dict(LONGROPE)
  assert model.to_dict()["rope_scaling"] == LONGROPE
  # the metadata a checkpoint stores is plain JSON, and reads back to an equal, hashable config
  meta = json.loads(json.dumps(model.to_dict()))
  assert meta["rope_scaling"] == LONGROPE and meta["rove_layers"] == [0, 2]
  back = GPTConfig.from_dict(meta)
  assert back == model and hash(back) == hash(model)
  assert len({back, model}) == 1
  # a JSON copy of the whole run config reads back to an equal one
  assert RunConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
  # the restored rope_scaling gives the same frequencies, at a length that picks long_factor
  want = scaling.from_config(LONGROPE, 64, max_len=256, seq_len=512)
  got = back.rope_scaling.frequencies(
    back.rot_dim, base=back.rope_base, max_len=back.max_len, seq_len=512
  )
  chex.assert_trees_all_close(got, want, rtol=0, atol=0)
  # a valid static argument of jit: the same config hits the same compilation
  traces = []

  def f(x, cfg):
    traces.append(cfg)
    return x * cfg.n_layer

  f = jax.jit(f, static_argnums=1)
  chex.assert_trees_all_close(f(np.float32(1.0), model), np.float32(6.0))
  f(np.float32(1.0), back)
  assert len(traces) == 1


def test_presets_pass_through_the_run_config_unchanged():
  for preset in ("tiny", "gpt2_124m", "gpt2_354m"):
    c = RunConfig(model=getattr(GPTConfig, preset)())
    assert overrides.apply(c, {}) == c and RunConfig.from_dict(c.to_dict()) == c
    assert c.model.d_ff == 4 * c.model.d_model and c.data.seq_len == c.model.max_len


def test_rope_scaling_is_parsed_once_and_lists_come_back_as_lists():
  cfg = GPTConfig.tiny(rope_scaling=LONGROPE)
  assert isinstance(cfg.rope_scaling, scaling.RopeScaling)
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.rope_scaling.factor = 2.0
  plain = cfg.to_dict()["rope_scaling"]
  assert isinstance(plain["short_factor"], list) and plain == LONGROPE
  assert GPTConfig.tiny(rope_scaling=scaling.RopeScaling.from_dict(LONGROPE)) == cfg
  # a dict mutated after construction does not reach the config
  source = {"rope_type": "linear", "factor": 2.0}
  cfg = GPTConfig.tiny(rope_scaling=source)
  source["factor"] = 8.0
  assert cfg.rope_scaling.factor == 2.0
  assert dataclasses.replace(cfg, rope_scaling={"type": "linear", "factor": 2}) == cfg
  with pytest.raises(
    ValueError,
    match=r"GPTConfig: rope_scaling must be a scaling.RopeScaling, "
    r"a transformers-style dict .* got list",
  ):
    GPTConfig.tiny(rope_scaling=[("rope_type", "yarn")])
  with pytest.raises(ValueError, match=r"GPTConfig: rope_scaling: .*needs the key 'factor'"):
    GPTConfig.tiny(rope_scaling={"rope_type": "linear"})
  with pytest.raises(ValueError, match=r"GPTConfig: rope_scaling: .*rot_dim / 2 = 32 entries"):
    GPTConfig.tiny(rope_scaling={**LONGROPE, "short_factor": [1.0] * 4})


@pytest.mark.parametrize(
  "stored",
  [
    {"rope_type": "yarn", "factor": 4.0},  # a dict, as to_dict writes it
    {"factor": 4.0, "type": "yarn"},  # a hand-written transformers v4 dict
  ],
)
def test_rope_scaling_dicts_read_back(stored):
  model = GPTConfig.tiny(rope_scaling=scaling.RopeScaling(rope_type="yarn", factor=4.0))
  assert GPTConfig.from_dict({**model.to_dict(), "rope_scaling": stored}) == model
  assert model.to_dict()["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}


def test_checkpoint_metadata_holds_the_model_config_once():
  built = resolve.resolve(
    overrides.apply(
      RunConfig(), {"model.rope_scaling.rope_type": "linear", "model.rope_scaling.factor": "2"}
    )
  )
  meta = json.loads(json.dumps(built.metadata()))
  assert "model" not in meta["config"] and meta["model"] == built.model.to_dict()
  assert meta["model"]["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
  # the resolved values: data.seq_len from model.max_len, the byte tokenizer
  assert meta["config"]["data"]["seq_len"] == 256 and meta["config"]["data"]["tokenizer"] == "bytes"
  assert RunConfig.from_metadata(meta) == built


@pytest.mark.parametrize(
  "override, message",
  [
    ({"model.n_head": 5}, r"d_model=384 must be divisible by n_head=5"),
    ({"model.rope_scaling": {"rope_type": "yarn", "factr": 2.0}}, r"rope_scaling.*'factr'"),
    ({"model.rope_scaling": {"rope_type": "yarn", "factor": 0.5}}, r"rope_scaling.*factor"),
    ({"model.rove_layers": (0, 9)}, r"rove_layers \[9\] out of range for n_layer=6"),
    (
      {"model.pos_encoding": "nope", "model.rope_scaling": {"rope_type": "linear", "factor": 2.0}},
      r"rope_scaling applies to rotary encodings only",
    ),
    ({"data.seq_len": 512, "model.max_len": 256}, r"data.seq_len=512 exceeds model.max_len=256"),
    ({"optim.warmup_steps": 10**6}, r"optim.warmup_steps"),
    ({"optim.lr": float("inf")}, r"optim.lr must be a finite number in \(0, inf\), got inf"),
    ({"optim.lr": float("nan")}, r"optim.lr must be a finite number"),
    ({"optim.weight_decay": float("inf")}, r"optim.weight_decay must be a finite number"),
    ({"optim.weight_decay": -0.1}, r"optim.weight_decay must be a finite number in \[0, inf\)"),
    ({"optim.b2": 1.5}, r"optim.b2 must be a finite number in \[0, 1\)"),
    ({"optim.b1": 1.0}, r"optim.b1 must be a finite number in \[0, 1\).*NaN"),
    ({"optim.min_lr_ratio": 1.5}, r"optim.min_lr_ratio must be a finite number in \[0, 1\]"),
    ({"run_steps": 0}, r"run_steps must be an int >= 1"),
    ({"run_steps": -1}, r"run_steps must be an int >= 1"),
    ({"keep_checkpoints": 0}, r"keep_checkpoints must be an int >= 1"),
    ({"optim.max_nonfinite": 0}, r"optim.max_nonfinite must be an int >= 1"),
    ({"sample_tokens": -5}, r"sample_tokens must be an int >= 0"),
    ({"optim.clip_norm": -1.0}, r"optim.clip_norm .*clip_norm=0 turns clipping off"),
    ({"optim.eps": 0.0}, r"optim.eps must be a finite number in \(0, inf\)"),
  ],
)
def test_validation_errors_name_the_field(override, message):
  with pytest.raises(ValueError, match=message):
    overrides.apply(RunConfig(), override)


@pytest.mark.parametrize(
  "key, message",
  [
    ("model.n_layers", r"model has no field 'n_layers'; did you mean --config.model.n_layer\?"),
    ("optimizer.lr", r"the config has no field 'optimizer'; did you mean --config.optim.lr\?"),
    (
      "model.rope_scaling.typ",
      r"model.rope_scaling has no key 'typ'; did you mean "
      r"'rope_type'\? its keys are rope_type, factor, ",
    ),
    ("model.rope_scaling.factor.x", r"model.rope_scaling.factor is a field, not a section"),
    ("model.rope_scaling", r"model.rope_scaling is a section, not a field; .*rope_type=yarn"),
    ("steps.max", r"steps is a field, not a section"),
    ("zzz", r"the config has no field 'zzz'; the config has: async_checkpoints, "),
  ],
)
def test_command_line_overrides_of_unknown_fields_name_the_closest(key, message):
  assert re.search(message, overrides.problem(key, "1"))
  with pytest.raises(ValueError, match=message):
    overrides.apply(RunConfig(), [(key, "1")])


def test_every_field_is_a_valid_override():
  """Every field --help-config lists, and every key of model.rope_scaling, takes a value."""
  fields = [line.split(" = ")[0] for line in run_config.describe()]
  fields += [f"model.rope_scaling.{k}" for k in scaling.KEYS]
  assert "model.rope_scaling.factor" in fields and "optim.lr" in fields
  assert "model.rope_scaling" in fields  # a section, unset: refused with how to set its fields
  fields.remove("model.rope_scaling")
  assert [k for k in fields if overrides.problem(k, "1") is not None] == []


@pytest.mark.parametrize(
  "key, value, want",
  [
    ("async_checkpoints", "false", False),
    ("async_checkpoints", "Yes", True),
    ("optim.lr", "3e-4", 3e-4),
    ("steps", "1_000", 1000),
    ("data.path", "a=b,c", "a=b,c"),
    ("data.seq_len", "None", None),
    ("model.rove_layers", "0,2", (0, 2)),
    ("model.rove_layers", "[1]", (1,)),
    ("model.pos_encoding", "'rope'", "rope"),
    ("model.rope_scaling.short_factor", "1,2.5", [1.0, 2.5]),
    ("model.rope_scaling.truncate", "false", False),
  ],
)
def test_override_values_are_parsed_by_the_field_type(key, value, want):
  path, got = overrides._parsed(key, value)
  assert path == tuple(key.split("."))
  assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
  "key, value, message",
  [
    ("steps", "ten", r"'ten' is not an int$"),
    ("async_checkpoints", "maybe", r"'maybe' is not a bool: give true or false$"),
    ("optim.lr", "fast", r"'fast' is not a number$"),
    ("data.seq_len", "x", r"'x' is not an int or None"),
    ("model.rove_layers", "0,(", r"is not a list: give numbers separated by commas"),
    ("steps", overrides.MISSING, r"no value: give --config.steps=VALUE"),
  ],
)
def test_override_values_of_the_wrong_type_are_named(key, value, message):
  assert re.search(message, overrides.problem(key, value))


def test_fields_follow_what_they_derive_from_unless_set():
  c = RunConfig()  # the tiny preset: 6 heads, d_model 384, context 256
  wider = overrides.apply(c, {"model.d_model": 192, "model.n_head": 3, "data.seq_len": 512})
  assert (wider.model.d_ff, wider.model.n_kv_head, wider.model.max_len) == (768, 3, 512)
  kept = overrides.apply(c, {"model.d_model": 192, "model.d_ff": 100, "model.max_len": 512})
  assert (kept.model.d_ff, kept.data.seq_len, kept.model.max_len) == (100, 256, 512)
  gqa = overrides.apply(overrides.apply(c, {"model.n_kv_head": 2}), {"model.n_head": 12})
  assert gqa.model.n_kv_head == 2  # set by the config: no longer follows
  # a context that does not follow (256 over 128 tokens) raised with the training length in
  # one command line: the overrides apply together, not section by section
  short = RunConfig(data=run_config.DataConfig(seq_len=128))
  both = resolve.command_line(
    short, overrides.split(["--config.data.seq_len=512", "--config.model.max_len=512"])
  )
  assert (both.data.seq_len, both.model.max_len) == (512, 512)


def test_config_files_must_return_a_run_config(tmp_path):
  legacy = tmp_path / "legacy.py"
  legacy.write_text(
    "class ConfigDict(dict):  # what an ml_collections config file returned\n"
    "  pass\n\ndef get_config():\n  return ConfigDict(steps=3)\n"
  )
  with pytest.raises(
    ValueError,
    match=r"get_config\(\) returned a ConfigDict, not a RunConfig "
    r"\(config files no longer return",
  ):
    overrides.load_file(str(legacy))
  with_arg = tmp_path / "with_arg.py"
  with_arg.write_text(
    "from rove_jax.train.run_config import RunConfig\n\n"
    "def get_config(steps):\n  return RunConfig(steps=100 * int(steps))\n"
  )
  assert overrides.load_file(f"{with_arg}:7").steps == 700


def test_train_command_line_errors_exit_2_with_one_message(tmp_path):
  """rove-train's flag errors: the unknown key is named although the valid one is given too;
  absl's type errors, a config file without get_config() and one that raises or exits exit 2
  too, without a traceback."""
  noget = tmp_path / "noget.py"
  noget.write_text("X = 1\n")
  raises = tmp_path / "raises.py"
  raises.write_text(
    "from rove_jax.train.configs import tiny\n\n"
    "def get_config():\n  c = tiny.get_config()\n  steps = int('x')\n"
    "  return c\n"
  )
  exits = tmp_path / "exits.py"
  exits.write_text("import sys\n\ndef get_config():\n  sys.exit(0)\n")
  tiny = str(ROOT / "configs" / "tiny.py")
  for argv, expected in [
    (
      ["--config", str(exits)],  # exit 0 would say a run succeeded that never started
      f"error: --config {exits}, line 4 (sys.exit(0)): the config file exited",
    ),
    (
      ["--config", tiny, "--config.model.n_layer=2", "--config.model.n_layers=2"],
      "error: --config.model.n_layers=2: model has no field 'n_layers'; did you mean "
      "--config.model.n_layer?",
    ),
    (["--config", tiny, "--config.steps=abc"], "error: --config.steps=abc: 'abc' is not an int"),
    (["--config", str(noget)], "a config file defines get_config()"),
    (
      ["--config", str(raises)],  # the file, line and code that raised
      f"error: --config {raises}, line 5 (steps = int('x')): ValueError: invalid literal "
      f"for int() with base 10: 'x'",
    ),
  ]:
    r = subprocess.run(
      [sys.executable, "-m", "rove_jax.cli.train", *argv, "--workdir", str(tmp_path / "w")],
      capture_output=True,
      text=True,
      timeout=120,
      cwd=ROOT,
      env=subprocess_env(),
    )
    assert r.returncode == 2, (argv, r.stderr[-2000:])
    assert expected in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr[-2000:])
  assert not (tmp_path / "w").exists()  # nothing ran


def test_rope_scaling_from_the_command_line(tmp_path):
  tiny = ROOT / "configs" / "tiny.py"
  c = parse_config_file(
    tiny,
    "--config.model.rope_scaling.rope_type=yarn",
    "--config.model.rope_scaling.factor=4",
    "--config.model.rope_scaling.original_max_position_embeddings=128",
  )
  assert c.model.rope_scaling.to_dict() == {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 128,
  }
  # unset: plain RoPE
  assert parse_config_file(tiny).model.rope_scaling is None
  # cleared from the command line
  assert (
    parse_config_file(
      write_tiny_with_longrope(tmp_path), "--config.model.rope_scaling=None"
    ).model.rope_scaling
    is None
  )
  # A dict from a config file, with one key overridden on the command line.
  c = parse_config_file(
    write_tiny_with_longrope(tmp_path),
    "--config.model.rope_scaling.original_max_position_embeddings=64",
  )
  got = c.model.rope_scaling
  assert got.original_max_position_embeddings == 64
  assert list(got.short_factor) == LONGROPE["short_factor"]
  with pytest.raises(ValueError, match=r"rope_scaling.*unknown keys \['facter'\]"):
    overrides.apply(RunConfig(), {"model.rope_scaling": {"rope_type": "yarn", "facter": 2.0}})


def test_a_workdir_that_is_a_file_has_its_own_message(tmp_path):
  (tmp_path / "f").write_text("x")
  with pytest.raises(ValueError, match=r"is a file, not a directory"):
    resume.check_workdir(str(tmp_path / "f"))


def test_unknown_model_fields_are_named_with_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown fields \['n_layers'\]; known fields: .*'n_layer'"):
    GPTConfig.from_dict({**GPTConfig.tiny().to_dict(), "n_layers": 2})


_NO_BACKEND = textwrap.dedent("""
    import sys
    from jax._src import xla_bridge
    from rove_jax.train import overrides, resolve, run_config
    from rove_jax.nn.model_config import GPTConfig
    from rove_jax.cli import train as train_cli

    resolve.resolve(run_config.RunConfig())
    for scaling in ({"rope_type": "yarn", "factor": 4.0}, {"rope_type": "dynamic", "factor": 2.0},
                    {"rope_type": "llama3", "factor": 8.0}, {"rope_type": "ntk", "factor": 2.0},
                    %(longrope)r):
      GPTConfig.tiny(rope_scaling=scaling)
    c = train_cli.load(train_cli.resolve_config_arg("tiny"),
                       overrides.split(["--config.model.rove_layers=(0,2)"]))
    assert c.model.rove_layers == (0, 2)
    print("before:", xla_bridge.backends_are_initialized())
    import jax.numpy as jnp
    jnp.zeros(1)  # the check below can fail: a device array starts a backend
    print("after:", xla_bridge.backends_are_initialized())
    """) % {"longrope": LONGROPE}


def test_building_and_validating_configs_starts_no_jax_backend():
  """jax.distributed must start before any backend: rove-train starts it in main, after it
  has read the config file."""
  r = subprocess.run(
    [sys.executable, "-c", _NO_BACKEND],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    env=subprocess_env(devices=1),
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "before: False" in r.stdout and "after: True" in r.stdout, r.stdout


def test_config_names_resolve_to_packaged_files(tmp_path):
  path = train_cli.resolve_config_arg("tiny")
  assert path == os.path.join(train_cli.CONFIG_DIR, "tiny.py") and os.path.isfile(path)
  assert train_cli.resolve_config_arg("demo:quick").endswith(
    os.path.join("configs", "demo.py") + ":quick"
  )
  assert set(train_cli.packaged_configs()) >= {"tiny", "demo", "gpt2_124m", "gpt2_354m"}
  mine = tmp_path / "my_config.py"
  mine.write_text("")
  for given in (str(ROOT / "configs" / "tiny.py"), str(mine), f"{mine}:arg"):
    assert train_cli.resolve_config_arg(given) == given  # files pass through untouched
  for missing in ("configs/tinny.py", "nothing_here.py", str(tmp_path)):
    with pytest.raises(
      app.UsageError,
      match=r"--config .*: (no such file|is not a file); give "
      r"a config file \(e.g. configs/tiny.py\)",
    ):
      train_cli.resolve_config_arg(missing)
  # A directory named like a config (a workdir: `--config tiny --workdir tiny`) is not a file.
  (tmp_path / "tiny").mkdir()
  cwd = os.getcwd()
  try:
    os.chdir(tmp_path)
    assert train_cli.resolve_config_arg("tiny") == path
  finally:
    os.chdir(cwd)
  assert train_cli._rewrite_config_flag(["x", "--config", "tiny", "--workdir", "w"])[2] == path
  assert train_cli._rewrite_config_flag(["x", "--config=tiny"])[1] == "--config=" + path
  with pytest.raises(
    app.UsageError,
    match=r"'tinny' is neither a file nor a packaged config.*"
    r"'tiny'",
  ):
    train_cli.resolve_config_arg("tinny")


def test_rove_train_with_an_unknown_config_name_exits_2(tmp_path):
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.train",
      "--config",
      "tinny",
      "--workdir",
      str(tmp_path / "w"),
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=120,
    env=subprocess_env(devices=1),
  )
  assert r.returncode == 2 and "neither a file nor a packaged config" in r.stderr, r.stderr
  # A stray positional argument: one line, exit 2, nothing run.
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.train",
      "--config",
      "tiny",
      "--workdir",
      str(tmp_path / "w"),
      "steps=5",
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=120,
    env=subprocess_env(devices=1),
  )
  assert r.returncode == 2 and "error: unexpected arguments ['steps=5']" in r.stderr, r.stderr
  assert not (tmp_path / "w").exists()
  # No --config at all: the packaged names and an example, not absl's "must have a value".
  r = subprocess.run(
    [sys.executable, "-m", "rove_jax.cli.train", "--workdir", str(tmp_path / "w")],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=120,
    env=subprocess_env(devices=1),
  )
  assert r.returncode == 2 and r.stderr.startswith("error: --config is required: a config file"), (
    r.stderr
  )
  assert "'smoke'" in r.stderr and "rove-train --config smoke" in r.stderr, r.stderr
