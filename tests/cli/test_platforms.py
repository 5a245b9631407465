"""rove_jax.cli.platforms: where libtpu is installed and no TPU is attached, the commands start
JAX on the CPU only (no libtpu errors); everywhere else JAX's own choice is kept."""

from __future__ import annotations

import pytest

from rove_jax.cli import platforms


@pytest.fixture
def installed(monkeypatch):
  """Pretend these modules are installed (and no others of libtpu and the CUDA plugins)."""
  have = set()
  names = ("libtpu",) + platforms.CUDA_PLUGINS
  real = platforms._installed
  monkeypatch.setattr(platforms, "_installed",
                      lambda name: name in have if name in names else real(name))
  return have


def test_libtpu_without_a_tpu_runs_on_the_cpu(installed, tmp_path):
  installed.add("libtpu")
  env = {}
  assert platforms.skip_absent_tpu(env, dev=str(tmp_path)) == "cpu"
  assert env == {"JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("device", ["accel0", "vfio/0"])
def test_an_attached_tpu_is_left_to_jax(installed, tmp_path, device):
  installed.add("libtpu")
  (tmp_path / device).parent.mkdir(parents=True, exist_ok=True)
  (tmp_path / device).write_text("")
  env = {}
  assert platforms.tpu_attached(str(tmp_path))
  assert platforms.skip_absent_tpu(env, dev=str(tmp_path)) is None and env == {}


def test_vfio_without_numbered_groups_is_no_tpu(tmp_path):
  (tmp_path / "vfio").mkdir()
  (tmp_path / "vfio" / "vfio").write_text("")  # the control node every vfio host has
  assert not platforms.tpu_attached(str(tmp_path))


def test_no_libtpu_a_cuda_plugin_or_a_user_setting_changes_nothing(installed, tmp_path):
  env = {}
  assert platforms.skip_absent_tpu(env, dev=str(tmp_path)) is None and env == {}  # no libtpu
  installed.update({"libtpu", platforms.CUDA_PLUGINS[0]})
  assert platforms.skip_absent_tpu(env, dev=str(tmp_path)) is None and env == {}  # a GPU host
  installed.discard(platforms.CUDA_PLUGINS[0])
  env = {"JAX_PLATFORMS": "tpu"}
  assert platforms.skip_absent_tpu(env, dev=str(tmp_path)) is None
  assert env == {"JAX_PLATFORMS": "tpu"}
