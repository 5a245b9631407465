"""The paper-scale recipe's learning-rate sweep (study/paper_sweep.py): the plan lists the sweep
before the comparison, the cost ends in expected device-hours from compiled rows, bad flags
exit 2, and a run (a faked trainer, nothing trained) chooses each encoding's rate before any
comparison run trains, or stops at a best rate on the grid's edge."""

import json
import math
import os

import pytest

from study import paper_recipe
from tests.study.test_reproduce import _commands, _scale

RATES = ["0.00015", "0.0003", "0.0006", "0.0012", "0.0024"]  # gpt2_124m's 6e-4 x 1/4 .. x 4
LR = "--config.optim.lr="


def _flag(cmd, name):
  return cmd[cmd.index(name) + 1]


def _lr(cmd):
  return [a[len(LR) :] for a in cmd if a.startswith(LR)]


def test_dry_run_lists_the_sweep_before_the_comparison(capsys, tmp_path):
  data = str(tmp_path / "fw" / "*.parquet")
  code, out, err = _scale(
    capsys,
    tmp_path,
    "--scale",
    "gpt2_124m",
    "--data",
    data,
    "--topology",
    "v5e-8",
    "--sweep-steps",
    "5000",
    "--dry-run",
  )
  assert code == 0, err
  train = _commands(out, "train.py")
  assert len(train) == 2 * 5 * 3 + 2  # encodings x rates x sweep seeds, then the comparison
  sweep, comparison = train[:30], train[30:]
  expected = [
    (enc, seed, rate) for enc in ("rove", "rope") for rate in RATES for seed in (100, 101, 102)
  ]
  for cmd, (enc, seed, rate) in zip(sweep, expected):
    assert _flag(cmd, "--workdir") == str(tmp_path / "runs" / "sweep" / f"{enc}-s{seed}-lr{rate}")
    assert f"--config.model.pos_encoding={enc}" in cmd and f"--config.seed={seed}" in cmd
    assert _lr(cmd) == [rate] and "--config.steps=5000" in cmd
    assert f"--config.data.path={data}" in cmd
    # The comparison's config, mesh and grad_accum (bench/aot_results/124m_*_v5e-8.json).
    assert "--config.mesh.data=8" in cmd and "--config.optim.grad_accum=8" in cmd
  for cmd, enc in zip(comparison, ("rove", "rope")):
    assert _lr(cmd) == ["<chosen by the sweep>"]
    assert _flag(cmd, "--workdir") == str(tmp_path / "runs" / f"{enc}-s0-lr<chosen>")
    assert "--config.seed=0" in cmd and not [a for a in cmd if a.startswith("--config.steps")]
  assert out.index("Learning-rate sweep first (30 runs") < out.index("Training (2 run(s)")
  assert "the optimum of a shorter horizon may differ" in out
  [ev] = _commands(out, "-m rove_jax.cli.eval")  # the comparison runs only
  assert [_flag(ev, "--workdir"), _flag(ev, "--compare")] == [
    str(tmp_path / "runs" / f"{e}-s0-lr<chosen>") for e in ("rove", "rope")
  ]
  # The sweep's commands load and validate with rove-train's own flag parsing.
  from rove_jax.cli import train as train_cli
  from rove_jax.train import overrides

  argv = train_cli._rewrite_config_flag(["rove-train", *sweep[-1][2:]])
  given = overrides.split(argv[1:])
  assert not [p for p in (overrides.problem(k, v) for k, v in given) if p]
  c = overrides.apply(overrides.load_file(train_cli.config_arg(argv)), given)
  assert (c.optim.lr, c.steps, c.seed) == (0.0024, 5000, 102)


def test_full_horizon_sweep_and_no_sweep(capsys, tmp_path):
  code, out, err = _scale(
    capsys,
    tmp_path,
    "--scale",
    "gpt2_354m",
    "--encodings",
    "rove",
    "--sweep-lrs",
    "1e-4,2e-4,4e-4,8e-4",
    "--dry-run",
  )
  assert code == 0, err
  train = _commands(out, "train.py")
  assert [_lr(t) for t in train] == [
    [r] for r in ("0.0001", "0.0002", "0.0004", "0.0008") for _ in range(3)
  ] + [["<chosen by the sweep>"]]
  assert not [a for t in train for a in t if a.startswith("--config.steps")]
  assert "shorter horizon" not in out
  code, out, err = _scale(capsys, tmp_path, "--scale", "gpt2_354m", "--sweep-lrs", "", "--dry-run")
  assert code == 0, err
  train = _commands(out, "train.py")
  assert len(train) == 2 and not [_lr(t) for t in train if _lr(t)]
  assert [_flag(t, "--workdir") for t in train] == [
    str(tmp_path / "runs" / f"{e}-s0") for e in ("rove", "rope")
  ]
  assert "No learning-rate sweep (--sweep-lrs '', or no rotary encoding)" in out
  assert "expected device-hours: sweep 0.0 (none) + comparison" in out


def _aot_dir(tmp_path, bounds):
  """A compiled-figures directory: one gpt2_124m train row a {encoding: step-time bound}."""
  d = tmp_path / "aot"
  d.mkdir()
  for enc, bound in bounds.items():
    row = {
      "job": "train",
      "topology": "fake:2x2",
      "accelerator": "fake",
      "devices": 4,
      "mesh": {"data": 4, "fsdp": 1, "tensor": 1},
      "grad_accum": 2,
      "remat": "none",
      "pos_encoding": enc,
      "batch": 512,
      "length": 1024,
      "flops": 1e13,
      "fits": True,
      "roofline": {"step_time_bound_s": bound, "bound_by": "compute"},
    }
    (d / f"124m_{enc}_fake.json").write_text(
      json.dumps(
        {"config": "gpt2_124m", "argv": ["bench/aot.py", "--topology=fake-4"], "reports": [row]}
      )
    )
  return str(d)


def test_expected_device_hours_from_compiled_rows(capsys, tmp_path):
  aot = _aot_dir(tmp_path, {"rove": 0.5, "rope": 0.25})
  code, out, err = _scale(
    capsys, tmp_path, "--scale", "gpt2_124m", "--aot-dir", aot, "--sweep-steps", "1000", "--dry-run"
  )
  assert code == 0, err
  steps = paper_recipe.load_config("gpt2_124m").steps
  # By hand: device-hours = runs x steps x bound (s) x devices / 3600.
  sweep = 5 * 3 * 1000 * (0.5 + 0.25) * 4 / 3600  # 5 rates x 3 seeds a rotary encoding
  comparison = 1 * steps * (0.5 + 0.25) * 4 / 3600  # one seed
  assert math.isclose(sweep, 12.5)
  assert (
    f"expected device-hours: sweep {sweep:.1f} + comparison {comparison:.1f} = "
    f"{sweep + comparison:.1f} (compiled-figure bounds, not measurements)"
  ) in out
  assert (
    f"rove: 5 rates x 3 seeds = 15 runs x >= {1000 * 0.5 / 3600:.2f} h on fake-4 "
    f"(4 devices) >= {15 * 1000 * 0.5 * 4 / 3600:.1f} device-hours" in out
  )


def test_missing_figures_are_said_not_counted(capsys, tmp_path, monkeypatch):
  import rove_jax.nn.model

  monkeypatch.setattr(rove_jax.nn.model, "param_count", lambda cfg: 1000)
  aot = _aot_dir(tmp_path, {"rove": 0.5})
  code, out, err = _scale(
    capsys, tmp_path, "--scale", "gpt2_124m", "--aot-dir", aot, "--sweep-steps", "1000", "--dry-run"
  )
  assert code == 0, err
  steps = paper_recipe.load_config("gpt2_124m").steps
  sweep, comparison = 15 * 1000 * 0.5 * 4 / 3600, steps * 0.5 * 4 / 3600
  assert (
    f"expected device-hours: sweep {sweep:.1f} + comparison {comparison:.1f} = "
    f"{sweep + comparison:.1f} (compiled-figure bounds, not measurements); rove only: "
    f"rope has no compiled figures and its runs are not counted"
  ) in out
  tokens = 1000 * 512 * 1024
  assert (
    f"rope: 15 runs, no compiled figures (see the bench.aot command above): no "
    f"device-hours; analytic 6 N x tokens = {6000 * tokens:.3e} FLOPs a run"
  ) in out
  code, out, err = _scale(
    capsys, tmp_path, "--scale", "gpt2_124m", "--aot-dir", str(tmp_path / "fw"), "--dry-run"
  )
  assert code == 0, err
  assert "expected device-hours: unknown: no compiled figures for rove, rope" in out


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--sweep-lrs", "1e-4,2e-4,4e-4"], "needs at least 4 distinct learning rates"),
    (["--sweep-seeds", "100,101"], "needs at least 3 distinct seeds"),
    (["--seeds", "0,101"], "--sweep-seeds [101] are also comparison --seeds"),
    (["--sweep-steps", "700"], "--sweep-steps: more than the preset's 700 warmup steps"),
    (["--sweep-steps", "99999"], "and at most its 19073 steps"),
  ],
)
def test_bad_sweep_flags_exit_2_before_any_work(capsys, tmp_path, flags, message):
  code, _, err = _scale(
    capsys, tmp_path, "--scale", "gpt2_124m", "--data", str(tmp_path / "fw"), *flags
  )  # not a dry run: it would train
  assert code == 2 and message in err, err
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def _fake_trainer(monkeypatch, out_dir, best):
  """subprocess.call faked: a sweep run writes metrics.jsonl whose final held-out loss is
  lowest at its encoding's rate in `best`; the eval writes a report.md. Returns the calls, each
  (command, whether out_dir/lr_sweep.md existed when it ran)."""
  calls = []

  def fake_call(cmd, env=None):
    if cmd[1].endswith("train.py"):
      workdir = _flag(cmd, "--workdir")
      if os.sep + "sweep" + os.sep in workdir:
        enc = next(a.split("=")[1] for a in cmd if a.startswith("--config.model.pos_encoding"))
        seed = int(next(a.split("=")[1] for a in cmd if a.startswith("--config.seed=")))
        lr = float(_lr(cmd)[0])
        loss = 3.0 + 0.1 * math.log2(lr / best[enc]) ** 2 + 0.01 * (seed - 101)
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
          f.write(json.dumps({"step": 10, "loss": loss + 1, "val_loss": loss + 0.5}) + "\n")
          f.write(json.dumps({"step": 20, "loss": loss, "val_loss": loss}) + "\n")
    else:
      os.makedirs(_flag(cmd, "--out"))
      with open(os.path.join(_flag(cmd, "--out"), "report.md"), "w") as f:
        f.write("# Evaluation report\n")
    calls.append((cmd, os.path.exists(os.path.join(out_dir, "lr_sweep.md"))))
    return 0

  monkeypatch.setattr(paper_recipe.subprocess, "call", fake_call)
  return calls


def test_execution_chooses_each_rate_before_the_comparison(capsys, tmp_path, monkeypatch):
  calls = _fake_trainer(monkeypatch, tmp_path / "out", {"rove": 6e-4, "rope": 1.2e-3})
  code, out, err = _scale(capsys, tmp_path, "--scale", "gpt2_124m", "--data", str(tmp_path / "fw"))
  assert code == 0, err
  cmds = [c for c, _ in calls]
  assert [os.sep + "sweep" + os.sep in _flag(c, "--workdir") for c in cmds[:30]] == [True] * 30
  [(rove, md_rove), (rope, md_rope), (ev, _)] = calls[30:]
  assert md_rove and md_rope and not any(md for _, md in calls[:30])  # written in between
  assert _lr(rove) == ["0.0006"] and _lr(rope) == ["0.0012"]
  runs = tmp_path / "runs"
  assert _flag(rove, "--workdir") == str(runs / "rove-s0-lr0.0006")
  assert _flag(rope, "--workdir") == str(runs / "rope-s0-lr0.0012")
  assert "rove_jax.cli.eval" in ev
  assert [_flag(ev, "--workdir"), _flag(ev, "--compare")] == [
    str(runs / "rove-s0-lr0.0006"),
    str(runs / "rope-s0-lr0.0012"),
  ]
  record = json.loads((tmp_path / "out" / "lr_sweep.json").read_text())
  assert record["chosen"] == {"rove": 0.0006, "rope": 0.0012} and not record["refused"]
  assert record["seeds"] == [100, 101, 102]
  assert record["meta"]["steps"] == paper_recipe.load_config("gpt2_124m").steps
  assert record["meta"]["command"].startswith("python reproduce.py --runs-dir")
  readme = (tmp_path / "out" / "README.md").read_text()
  assert "## Learning-rate sweep" in readme and "| rove | 0.0006 (chosen) |" in readme
  assert "| rope | 0.0012 (chosen) |" in readme and "(lr_sweep.md)" in readme
  assert f"| {runs / 'rove-s0-lr0.0006'} | rove | 0 |" in readme
  plan = (tmp_path / "out" / "plan.txt").read_text()  # the plan as printed, before the sweep
  assert "'--config.optim.lr=<chosen by the sweep>'" in plan


def test_a_best_rate_at_the_edge_stops_before_the_comparison(capsys, tmp_path, monkeypatch):
  calls = _fake_trainer(monkeypatch, tmp_path / "out", {"rove": 6e-4, "rope": 2.4e-3})
  code, _, _ = _scale(capsys, tmp_path, "--scale", "gpt2_124m", "--data", str(tmp_path / "fw"))
  message = str(code)
  assert "the rope sweep: the best learning rate 0.0024" in message and "largest" in message
  assert "The fix: rerun `python reproduce.py --runs-dir" in message
  assert "--sweep-lrs extended past that end" in message
  assert len(calls) == 30 and all(
    os.sep + "sweep" + os.sep in _flag(c, "--workdir") for c, _ in calls
  )
  md = (tmp_path / "out" / "lr_sweep.md").read_text()
  assert "- rope: refused." in md and "- rove: 0.0006, strictly inside its grid" in md
  assert not (tmp_path / "out" / "README.md").exists()
