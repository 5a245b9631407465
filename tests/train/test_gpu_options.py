"""The XLA options of GPU compiles (rove_jax.train.gpu_options): only on GPUs, a flag in
XLA_FLAGS wins, ROVE_JAX_GPU_OPTIONS=off drops them; and a CPU compile accepts none."""

import types

import jax

from rove_jax.train import gpu_options

GPU = [types.SimpleNamespace(platform="gpu")]


def test_only_on_gpus(monkeypatch):
  monkeypatch.delenv(gpu_options.OFF_VAR, raising=False)
  monkeypatch.setenv("XLA_FLAGS", "")
  assert gpu_options.compiler_options(jax.devices("cpu")) == {}
  assert gpu_options.compiler_options([]) == {}
  assert gpu_options.compiler_options(GPU) == gpu_options.RECOMMENDED
  assert (
    gpu_options.compiler_options([types.SimpleNamespace(platform="cuda")])
    == gpu_options.RECOMMENDED
  )


def test_xla_flags_win_and_off_drops_all(monkeypatch):
  monkeypatch.setenv(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_gpu_enable_triton_gemm=true"
  )
  got = gpu_options.compiler_options(GPU)
  assert "xla_gpu_enable_triton_gemm" not in got
  assert got["xla_gpu_enable_latency_hiding_scheduler"] is True
  monkeypatch.setenv(gpu_options.OFF_VAR, "off")
  assert gpu_options.compiler_options(GPU) == {}


def test_every_option_is_a_known_xla_option():
  """A name XLA does not know fails the compile ("No such compile option"); these compile."""
  f = jax.jit(lambda x: x + 1, compiler_options=gpu_options.RECOMMENDED)
  assert float(f(1.0)) == 2.0
