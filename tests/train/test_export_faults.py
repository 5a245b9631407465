"""rove-export on a full disk: a real tmpfs of 2 MiB, mounted by the fixture (skipped, saying
why, where mounting is not permitted: it needs root), filled so that only part of the export
fits. Each case ends with one line `rove-export: error: ...` naming --out and ENOSPC, exit 1,
and leaves nothing that `export.load` takes for a finished export: whether the weights do not
fit, or the weights fit and config.json does not, or --overwrite replaces an export there. A
tmpfs without a free inode refuses --out itself (the check before the checkpoint is read).
"""

import os
import subprocess

import pytest

from rove_jax.cli import export as export_cli
from rove_jax.nn import param_files
from rove_jax.train import export


def mount_tmpfs(mnt, options: str):
  """Mounts a tmpfs at mnt (skipping the test where that is not permitted); returns a function
  that unmounts it."""
  mnt.mkdir()
  done = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True, text=True
  )
  if done.returncode != 0:
    pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()}): needs root")
  return lambda: subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_disk(tmp_path):
  unmount = mount_tmpfs(tmp_path / "mnt", "size=2m")
  try:
    yield tmp_path / "mnt"
  finally:
    unmount()


def fill(disk, leave: int) -> None:
  """Writes disk/filler until `leave` bytes (whole pages) are free on the tmpfs."""
  st = os.statvfs(disk)
  free = st.f_bavail * st.f_frsize
  (disk / "filler").write_bytes(b"\0" * (free - leave))
  st = os.statvfs(disk)
  assert st.f_bavail * st.f_frsize == leave


def pages(n_bytes: int) -> int:
  page = os.sysconf("SC_PAGE_SIZE")  # tmpfs allocates whole pages
  return -(-n_bytes // page) * page


@pytest.fixture
def weights_size(trained_run, tmp_path) -> int:
  """The size of the trained run's model.safetensors, from an export to an ordinary disk."""
  export.export_run(str(trained_run), str(tmp_path / "sized"), report=lambda *a: None)
  return (tmp_path / "sized" / param_files.WEIGHTS).stat().st_size


def export_fails_in_one_line(trained_run, out, capsys, *extra) -> str:
  code = export_cli.main(["--workdir", str(trained_run), "--out", str(out), *extra])
  err = capsys.readouterr().err
  assert code == 1, err
  assert "Traceback" not in err
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith(
    f"rove-export: error: writing the export to {out} failed: No space left on device (ENOSPC)"
  ), lines[0]
  return lines[0]


def assert_no_export(out) -> None:
  """Nothing in out that load reads as an export (nor the export's own files)."""
  with pytest.raises(FileNotFoundError):
    export.load(str(out))
  left = set(os.listdir(out)) if out.exists() else set()
  assert not left & {param_files.CONFIG, param_files.WEIGHTS, export.TOKENIZER_FILE}, left


def test_weights_that_do_not_fit_are_one_line_exit_1(trained_run, small_disk, weights_size, capsys):
  out = small_disk / "out"
  fill(small_disk, pages(weights_size // 2))
  line = export_fails_in_one_line(trained_run, out, capsys)
  assert "holds no export" in line and "free space there or choose another --out" in line
  assert not out.exists()  # the directory this call created, removed again
  assert_no_export(out)
  (small_disk / "filler").unlink()  # with room, the same command writes the export
  assert export_cli.main(["--workdir", str(trained_run), "--out", str(out)]) == 0
  assert export.load(str(out)).run["step"] == 6


def test_weights_that_fit_without_their_config_leave_no_export(
  trained_run, small_disk, weights_size, capsys
):
  out = small_disk / "out"
  fill(small_disk, pages(weights_size))  # the weights fit whole; config.json then does not
  export_fails_in_one_line(trained_run, out, capsys)
  assert_no_export(out)


def test_an_overwrite_that_does_not_fit_leaves_no_old_config_beside_new_weights(
  trained_run, small_disk, capsys
):
  out = small_disk / "out"
  assert export_cli.main(["--workdir", str(trained_run), "--out", str(out)]) == 0
  capsys.readouterr()
  fill(small_disk, 0)
  export_fails_in_one_line(trained_run, out, capsys, "--overwrite")
  assert out.is_dir()  # not created by this call: kept, without the export's files
  assert_no_export(out)


def test_a_disk_without_room_for_the_directory_is_one_line_exit_1(trained_run, tmp_path, capsys):
  disk = tmp_path / "mnt"
  unmount = mount_tmpfs(disk, "size=2m,nr_inodes=2")  # the root and one file
  try:
    (disk / "filler").touch()  # no inode left: --out cannot be created
    code = export_cli.main(["--workdir", str(trained_run), "--out", str(disk / "out")])
    err = capsys.readouterr().err
  finally:
    unmount()
  assert code == 1, err
  assert err.strip() == (
    f"rove-export: error: cannot create or write the export directory "
    f"{disk / 'out'} (No space left on device (ENOSPC)); free space there "
    f"or choose another --out"
  )
