"""The check a run makes of its prepared shards at every start (rove_jax.data.shard_check): a
shard is hashed once per machine, later starts only stat it, and a shard changed since (in
place, keeping its size and even its modification time; or the local copy of a gs:// shard; or
the object in the bucket) is hashed again and found."""

import os
import pathlib
import re
import time

import pytest

from rove_jax import data
from rove_jax.data import prepared, shard_check
from rove_jax.storage import paths
from tests.conftest import write_corpus


@pytest.fixture(autouse=True)
def local_cache(tmp_path, monkeypatch) -> pathlib.Path:
  """Records and local copies of gs:// shards go under tmp_path, not the user's cache."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
  return tmp_path / "xdg-cache"


def make(tmp_path, out) -> tuple[str, dict]:
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=4, chars=1200))
  manifest = data.prepare_dataset(
    corpus, "bytes", str(out), tokens_per_shard=600, progress=False, log=lambda *a: None
  )
  return paths.resolve(str(out)), manifest


def check(path, **kw) -> tuple[tuple[int, list[str]], list[str]]:
  """(shards hashed, files of those that do not match), and the lines logged."""
  lines = []
  hashed, bad = shard_check.check(path, prepared.read_manifest(path), log=lines.append, **kw)
  return (hashed, [s["file"] for s in bad]), lines


def check_for_run(path, capsys, **kw) -> list[str]:
  """prepared.check_for_run's lines (it raises on a shard that does not match)."""
  capsys.readouterr()
  prepared.check_for_run(path, prepared.read_manifest(path), **kw)
  return capsys.readouterr().err.splitlines()


def edit_in_place(file: pathlib.Path) -> None:
  """One token changed to another, the size and the modification time kept."""
  st = file.stat()
  with open(file, "r+b") as f:
    first = f.read(1)
    f.seek(0)
    f.write(bytes([first[0] ^ 1]))
  os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert file.stat().st_size == st.st_size and file.stat().st_mtime_ns == st.st_mtime_ns


def test_shards_are_hashed_once_then_only_stat_ed_until_one_changes(tmp_path, capsys):
  path, manifest = make(tmp_path, tmp_path / "p")
  n = sum(len(manifest["splits"][s]["shards"]) for s in data.SPLITS)
  time.sleep(shard_check.SETTLE_NS / 1e9 + 0.1)  # older than the file system clock's tick
  assert check(path)[0] == (n, [])
  (found, lines) = check(path)
  assert found == (0, []) and f"{n} shards of {path}" in lines[-1] and "0 hashed" in lines[-1]
  name = manifest["splits"]["train"]["shards"][1]["file"]
  shard = pathlib.Path(path) / name
  os.utime(shard)  # touched, not changed: hashed again (and recorded once it settled)
  assert check(path)[0] == (1, [])
  edit_in_place(shard)
  assert check(path)[0] == (1, [name])
  with pytest.raises(prepared.DamagedDataset) as info:
    check_for_run(path, capsys)
  message = str(info.value)
  assert re.match(rf"shard {re.escape(str(shard))} does not match its sha256", message)
  assert "rerun the command that prepared it" in message and "rove-prepare" in message
  assert "--config.data.allow_changed=True" in message and "\n" not in message
  lines = check_for_run(path, capsys, allow_changed=True)  # read as it is, with a warning
  assert any(f"WARNING: shard {shard} does not match" in l for l in lines), lines
  with pytest.raises(prepared.DamagedDataset):  # and found again at every start
    check_for_run(path, capsys)


def test_a_shard_that_fails_is_hashed_again_by_every_process_of_the_machine(tmp_path):
  path, manifest = make(tmp_path, tmp_path / "p")
  n = sum(len(manifest["splits"][s]["shards"]) for s in data.SPLITS)
  time.sleep(shard_check.SETTLE_NS / 1e9 + 0.1)
  victim = pathlib.Path(path) / manifest["splits"]["val"]["shards"][0]["file"]
  good = victim.read_bytes()
  edit_in_place(victim)
  assert check(path, process_index=0, process_count=2)[0] == (n, [victim.name])
  assert check(path, process_index=1, process_count=2)[0] == (1, [victim.name])
  victim.write_bytes(good)  # the others are recorded, whichever process hashed them
  assert check(path, process_index=1, process_count=2)[0] == (1, [])


def test_local_copies_of_gs_shards_are_checked_at_every_start(
  tmp_path, gcs_bucket, local_cache, capsys
):
  out = f"{gcs_bucket}/ds"
  path, manifest = make(tmp_path, out)
  first = manifest["splits"]["train"]["shards"][0]["file"]
  check(path)  # copies every shard into the local cache
  time.sleep(shard_check.SETTLE_NS / 1e9 + 0.1)
  check(path)
  assert check(path)[0] == (0, [])
  # A local copy edited in place is not taken for the dataset: it is fetched again.
  (copy,) = (local_cache / "rove_jax" / "remote").rglob(first)
  intact = copy.read_bytes()
  edit_in_place(copy)
  (found, lines) = check(path)
  assert found == (1, []) and copy.read_bytes() == intact
  assert any(f"the local copy {copy} of {out}/{first} does not match" in l for l in lines)
  # An object changed in the bucket (same size) gets a new copy, which is hashed and found.
  victim = f"{out}/{manifest['splits']['val']['shards'][0]['file']}"
  good = paths.read_bytes(victim)
  time.sleep(0.01)  # another modification time: the old object's copy is not reused
  paths.write_atomic(victim, bytes([good[0] ^ 1]) + good[1:])
  with pytest.raises(
    prepared.DamagedDataset,
    match=rf"shard {re.escape(victim)} \(a fresh local copy of it too\) does "
    rf"not match its sha256",
  ):
    check_for_run(path, capsys)
