"""rove_jax.cli.platforms: where libtpu or a CUDA plugin is installed and no accelerator of theirs
is attached, the commands start JAX on the CPU only (no libtpu errors, no CUDA plugin
traceback); everywhere else JAX's own choice is kept."""

from __future__ import annotations

import pytest

from rove_jax.cli import platforms


@pytest.fixture
def installed(monkeypatch):
  """Pretend these modules are installed (and no others of libtpu and the CUDA plugins)."""
  have = set()
  names = ("libtpu",) + platforms.CUDA_PLUGINS
  real = platforms._installed
  monkeypatch.setattr(
    platforms, "_installed", lambda name: name in have if name in names else real(name)
  )
  return have


def test_libtpu_without_a_tpu_runs_on_the_cpu(installed, tmp_path):
  installed.add("libtpu")
  env = {}
  assert platforms.skip_absent_accelerators(env, dev=str(tmp_path)) == "cpu"
  assert env == {"JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("device", ["accel0", "vfio/0"])
def test_an_attached_tpu_is_left_to_jax(installed, tmp_path, device):
  installed.add("libtpu")
  (tmp_path / device).parent.mkdir(parents=True, exist_ok=True)
  (tmp_path / device).write_text("")
  env = {}
  assert platforms.tpu_attached(str(tmp_path))
  assert platforms.skip_absent_accelerators(env, dev=str(tmp_path)) is None and env == {}


def test_vfio_without_numbered_groups_is_no_tpu(tmp_path):
  (tmp_path / "vfio").mkdir()
  (tmp_path / "vfio" / "vfio").write_text("")  # the control node every vfio host has
  assert not platforms.tpu_attached(str(tmp_path))


def test_no_plugin_an_attached_gpu_or_a_user_setting_changes_nothing(installed, tmp_path):
  env = {}
  assert platforms.skip_absent_accelerators(env, dev=str(tmp_path)) is None and env == {}
  installed.update({"libtpu", platforms.CUDA_PLUGINS[0]})
  (tmp_path / "nvidia0").write_text("")  # a GPU host
  assert platforms.gpu_attached(str(tmp_path))
  assert platforms.skip_absent_accelerators(env, dev=str(tmp_path)) is None and env == {}
  installed.discard(platforms.CUDA_PLUGINS[0])
  env = {"JAX_PLATFORMS": "tpu"}
  assert platforms.skip_absent_accelerators(env, dev=str(tmp_path)) is None
  assert env == {"JAX_PLATFORMS": "tpu"}


@pytest.mark.parametrize("plugin", platforms.CUDA_PLUGINS)
def test_a_cuda_plugin_without_a_gpu_runs_on_the_cpu(installed, tmp_path, plugin):
  installed.add(plugin)
  (tmp_path / "nvidiactl").write_text("")  # the driver's control node is no GPU
  env = {}
  assert not platforms.gpu_attached(str(tmp_path))
  assert platforms.skip_absent_accelerators(env, dev=str(tmp_path)) == "cpu"
  assert env == {"JAX_PLATFORMS": "cpu"}


def test_a_gpu_topology_gets_the_constraints_check_skipped():
  env = {}
  assert platforms.prepare_gpu_compile("h200-8", env)
  assert env == {"JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1"}
  env = {"JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "0"}  # the user's setting is kept
  assert platforms.prepare_gpu_compile("H100-16", env)
  assert env["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] == "0"
  env = {}
  assert not platforms.prepare_gpu_compile("v5e-8", env) and env == {}
