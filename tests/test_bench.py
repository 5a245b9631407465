"""The benchmark suite: `python -m bench --suite cpu --smoke` end to end (every section of the
quick suite at the smallest shapes, under a minute on 2 cores), the GPU suite's argument and
device checks, the FLOP formula, the GPU script's syntax.

Only properties that survive a noisy shared machine are asserted: positive finite ratios and
throughputs, MFU in (0, 1], compile time growing from 1 to 4 layers. Not speed-ups.
"""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from bench import suite
from rove_jax.nn.model import GPTConfig
from tests.conftest import made_once, subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _clean_env():
  # conftest splits the CPU into 8 fake devices; the suite must see the machine as it is, and
  # compile its programs itself (it times compilation): no shared compilation cache.
  return subprocess_env(devices=None, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
  """(the smoke suite's JSON, what it printed), run once a test session (made_once: the
  workers that get this module's tests share it)."""

  def run(folder):
    proc = subprocess.run(
      [sys.executable, "-m", "bench", "--suite", "cpu", "--smoke", "--out", str(folder / "q.json")],
      cwd=ROOT,
      env=_clean_env(),
      capture_output=True,
      text=True,
      timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder / "stdout.txt").write_text(proc.stdout)

  folder = made_once(tmp_path_factory, "bench-smoke-suite", run)
  return json.loads((folder / "q.json").read_text()), (folder / "stdout.txt").read_text()


def _positive(x):
  return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_quick_suite_prints_every_table(quick):
  _, stdout = quick
  for title in (
    "## Train step",
    "## Peak memory",
    "## Long-context forward",
    "## Decoding",
    "## Train-step compile time",
    "MFU = model FLOPs",
    "Measured peak matmul",
  ):
    assert title in stdout
  assert stdout.count("|---|") >= 7


@pytest.mark.slow
def test_quick_suite_train_and_mfu(quick):
  res, _ = quick
  assert res["suite"] == "cpu" and res["quick"] is True and res["smoke"] is True
  assert "6 * N_nonembed" in res["flops_formula"]
  assert _positive(res["peak_matmul"]["flops_per_s"])
  assert len(res["train"]) == 1
  for t in res["train"]:
    assert set(t["rows"]) == {"rove", "rope", "nope"}
    assert _positive(t["ratio_rove_over_rope"]) and _positive(t["flops_per_step"])
    assert t["rows"]["rope"]["paired_ratio_vs_rope"] == 1.0
    for r in t["rows"].values():
      assert _positive(r["tokens_per_s"]) and _positive(r["paired_ratio_vs_rope"])
      assert 0 < r["mfu"] <= 1, r
      assert len(r["times_s"]) == t["repeats"] and math.isfinite(r["loss"])


@pytest.mark.slow
def test_quick_suite_memory_longctx_decode_compile(quick):
  res, _ = quick
  mem = res["memory"]
  assert mem["measure"] == "peak_rss_gib" and _positive(mem["ratio_rove_over_rope"])
  for r in mem["rows"].values():
    assert _positive(r["peak_rss_gib"]) and math.isfinite(r["loss"])
  rows = res["longctx"]["rows"]
  assert {(r["T"], r["kernel"]) for r in rows} == {(512, "xla"), (512, "chunked")}
  for r in rows:
    assert "error" not in r, r
    assert _positive(r["tokens_per_s"]) and _positive(r["peak_rss_gib"]) and r["finite"]
  dec = res["decode"]
  assert _positive(dec["ratio_rove_over_rope"])
  for r in dec["rows"].values():
    assert _positive(r["tokens_per_s"])
  comp = res["compile"]["rows"]
  assert [r["n_layer"] for r in comp] == [1, 2, 4]
  assert all(_positive(r["total_s"]) for r in comp)
  # 1 -> 4 layers is four times the traced graph: robust; 1 -> 2 alone could be noise.
  assert comp[-1]["total_s"] > comp[0]["total_s"]


def test_gpu_suite_without_gpu_is_a_clear_error():
  proc = subprocess.run(
    [sys.executable, "-m", "bench", "--suite", "gpu"],
    cwd=ROOT,
    env=_clean_env(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode != 0
  assert "--suite gpu needs a CUDA GPU" in proc.stderr, proc.stderr[-2000:]


def test_gpu_spec_builds_its_configs():
  spec = suite.make_spec("gpu", quick=False)
  names = [m.name for m in spec.train_models]
  assert names == ["gpt2_124m", "gpt2_354m"]
  cfg = spec.train_models[0].config()
  assert (cfg.attention_impl, cfg.dtype, spec.train_models[0].seq) == ("cudnn", "bfloat16", 1024)
  assert 16384 in spec.long_lengths and spec.matmul_dtype == "bfloat16"
  with pytest.raises(ValueError, match="unknown suite"):
    suite.make_spec("tpu", quick=True)
  with pytest.raises(ValueError, match="--smoke is for the cpu suite"):
    suite.make_spec("gpu", quick=False, smoke=True)
  # --smoke shrinks the cpu suite below --quick and keeps every section.
  quick, smoke = suite.make_spec("cpu", quick=True), suite.make_spec("cpu", False, smoke=True)
  assert smoke.quick and smoke.smoke and not quick.smoke
  assert len(smoke.compile_depths) == len(quick.compile_depths) and len(smoke.train_models) == 1
  assert smoke.train_models[0].config().d_model < quick.train_models[0].config().d_model


def test_flops_formula_by_hand():
  # Count tiny's non-embedding parameters (weights, biases, norms) independently.
  cfg = GPTConfig.tiny(n_layer=2)
  E, F, L = cfg.d_model, cfg.d_ff, cfg.n_layer
  per_layer = 4 * E * E + 4 * E + 2 * E * F + F + E + 4 * E  # attn, mlp, two layernorms
  n = L * per_layer + 2 * E  # + the final norm
  B, T = 4, 128
  want = 6 * n * B * T + 6 * L * T * E * B * T
  assert suite.flops_per_step(cfg, B, T) == pytest.approx(want, rel=1e-12)


def test_gpu_check_script_parses():
  subprocess.run(["bash", "-n", os.path.join(ROOT, "bench", "gpu_check.sh")], check=True)


def _gpu_check(tmp_path, **env):
  return subprocess.run(
    ["bash", os.path.join("bench", "gpu_check.sh")],
    cwd=ROOT,
    env={**os.environ, "OUT": str(tmp_path), **env},
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_gpu_check_runs_the_chosen_sections_past_a_failing_one(tmp_path):
  # On this CPU host both chosen sections fail (no nvidia-smi; "auto" is not cuDNN here): each
  # failure is recorded and the check goes on to the next section and ends with status 0.
  run = _gpu_check(tmp_path, SECTIONS="devices,auto-kernel", BUDGET="100")
  assert run.returncode == 0, run.stderr
  rows = [line.split("\t") for line in (tmp_path / "sections.tsv").read_text().splitlines()]
  status = {name: rc for name, rc, _ in rows[1:]}
  assert rows[0] == ["section", "status", "seconds"]
  assert status.pop("auto-kernel") == "1"
  assert status.pop("devices") not in ("0", "not-selected", "skipped")
  assert set(status.values()) == {"not-selected"} and len(status) == 10
  log = (tmp_path / "gpu_check.log").read_text()
  assert "auto-kernel: FAILED (exit 1)" in log and "== [" in log
  assert (tmp_path / "auto-kernel.log").exists() and not (tmp_path / "peer.log").exists()


@pytest.mark.parametrize(
  "env, says",
  [
    ({"SECTIONS": "devices,tests"}, "unknown section 'tests'"),
    ({"BUDGET": "8m"}, "BUDGET must be a whole number of seconds"),
  ],
)
def test_gpu_check_refuses_bad_settings_before_it_starts(tmp_path, env, says):
  run = _gpu_check(tmp_path / "out", **env)
  assert run.returncode == 2 and says in run.stderr
  assert not (tmp_path / "out").exists()


def test_peer_ratio_sides_by_their_suffixes(capsys):
  """bench.peer_ratio's --encodings entries: +fused takes the fused loss, +fused_attention the
  attention kernel "fused", and the Hopper kernel's variant features with it (not without it,
  nor a variant it refuses); an unknown suffix exits 2 naming the known ones, before any side
  runs."""
  from bench import peer_ratio

  assert peer_ratio.side_options("rope") == ("rope", "xla", "auto", "default")
  assert peer_ratio.side_options("rove+fused_attention") == ("rove", "xla", "fused", "default")
  both = peer_ratio.side_options("rove+fused_attention+fused")
  assert both == ("rove", "fused", "fused", "default")
  bf16 = peer_ratio.side_options("rove+fused_attention+2wg+tma+bf16")
  assert bf16 == ("rove", "xla", "fused", "2wg+tma+bf16")
  with pytest.raises(ValueError, match=r"rope\+bf16: \+bf16 is .* add \+fused_attention"):
    peer_ratio.side_options("rope+bf16")
  with pytest.raises(ValueError, match=r"'tma' .* needs '2wg'"):
    peer_ratio.side_options("rove+fused_attention+tma")
  cfg = peer_ratio.model_config("gpt2_124m", "rove", "fused", "bf16")
  assert (cfg.attention_impl, cfg.dtype, cfg.pos_encoding) == ("fused", "bfloat16", "rove")
  assert cfg.fused_variant == "bf16"
  with pytest.raises(SystemExit) as exit_:
    peer_ratio.main(["--no-torch", "--encodings", "rope,rope+fast"])
  assert exit_.value.code == 2
  err = capsys.readouterr().err
  known = "+fused, +fused_attention, +2wg, +tma, +bwd2wg, +bwdtma, +bf16, +matrix"
  assert f"rope+fast: unknown suffix +fast; the suffixes are {known}" in err


def _fused_gpu_args(**kw):
  import argparse

  return argparse.Namespace(
    **{"kernels": None, "backward_block": "32", "length": 1024, "layout": "half", **kw}
  )


def test_fused_gpu_kernel_labels_are_checked_before_anything_compiles(capsys):
  """bench.fused_gpu --kernels: any Hopper variant by its features, in the order given; an
  unknown label, a refused variant or one these settings have no row for exits 2 naming it
  and why (it once dropped such a label without a word)."""
  from bench import fused_gpu

  rows = fused_gpu.variants(
    _fused_gpu_args(kernels="hopper bwd2wg+bwdtma bf16,triton bwd64,hopper", backward_block="32,64")
  )
  assert rows == [("hopper bwd2wg+bwdtma bf16", None), ("triton bwd64", 64), ("hopper", None)]
  assert fused_gpu.hopper_options("hopper bwd2wg+bwdtma bf16") == dict(
    backward_wgs=2, backward_producer=True, bf16_turns=True
  )
  everything = fused_gpu.variants(_fused_gpu_args(length=1000))
  assert [n for n, _ in everything] == ["hopper", "hopper matrix", "hopper bf16", "triton"]
  for kw, says in [
    (dict(kernels="hopper,hoper 2wg"), "'hoper 2wg': not a kernel label; the labels are 'hopper'"),
    (dict(kernels="triton bwd64"), "with --backward-block 32, 'triton'"),
    (dict(kernels="hopper tma"), "'tma' (a producer warpgroup) needs '2wg'"),
    (dict(kernels="hopper 2wg", length=1000), "T=1000 is not a multiple of 128"),
    (dict(kernels="hopper bwd2wg", length=1000), "T=1000 is not a multiple of 128"),
    (dict(kernels="hopper bf16", layout="interleaved"), "only --layout half has"),
  ]:
    with pytest.raises(ValueError, match=re.escape(says)):
      fused_gpu.variants(_fused_gpu_args(**kw))
  with pytest.raises(SystemExit) as exit_:
    fused_gpu.main(["--aot", "h200", "--kernels", "hopper 2wg+bwdtma"])
  assert exit_.value.code == 2
  assert (
    "'hopper 2wg+bwdtma': fused variant '2wg+bwdtma': 'bwdtma' needs" in capsys.readouterr().err
  )


def test_fused_gpu_interpreted_refuses_a_cpu_pool_it_could_hang_on(monkeypatch, capsys):
  """bench.fused_gpu --interpret sizes XLA's CPU pool for the Hopper kernels' warpgroups before
  JAX starts; one its caller made too small (PJRT_NPROC) is refused before anything runs."""
  from bench import fused_gpu

  monkeypatch.setenv("PJRT_NPROC", "3")
  with pytest.raises(SystemExit) as exit_:
    fused_gpu.main(["--interpret", "--tiny", "--kernels", "hopper,hopper bwd2wg+bwdtma"])
  assert exit_.value.code == 2
  err = capsys.readouterr().err
  assert "runs this kernel's 3 warpgroups at once" in err and "Set PJRT_NPROC=4" in err


def test_gpu_check_names_only_rows_and_sides_that_exist():
  """Every --kernels label and --encodings entry bench/gpu_check.sh passes is one that
  bench.fused_gpu and bench.peer_ratio take at the section's settings: a typo there would
  cost a section of a GPU's scarce minutes."""
  from bench import fused_gpu, peer_ratio

  with open(os.path.join(ROOT, "bench", "gpu_check.sh")) as f:
    script = f.read()
  sections = script.split("\nsection ")[1:]
  checked = 0
  for text in sections:
    for labels in re.findall(r'--kernels "([^"]+)"', text):
      block = re.search(r"--backward-block (\S+)", text)
      lengths = [int(n) for n in re.findall(r'"\d+ (\d+)"', text)] or [1024]
      for length in lengths:
        args = _fused_gpu_args(kernels=labels, length=length)
        if block:
          args.backward_block = block.group(1)
        assert [n for n, _ in fused_gpu.variants(args)] == labels.split(","), text
        checked += 1
    for encodings in re.findall(r"--encodings (\S+)", text):
      for entry in encodings.split(","):
        peer_ratio.side_options(entry)
        checked += 1
  assert checked >= 10
