"""Locations a run reads and writes, local or `gs://bucket/key`, and the file operations on them.

Every module that touches a workdir, a prepared dataset, an export or an evaluation report goes
through the functions here (paths are plain strings: a local path, made absolute by `resolve`,
or a gs:// URL). Local paths use the operating system directly (link(2), fsync, os.replace,
memory maps); gs:// goes to `rove_jax.storage.gcs` (gcsfs, the `[gcs]` extra). Orbax and
tensorstore take the same strings and write gs:// natively.

Atomicity: `write_atomic` replaces a whole file at once on both backends (a temporary file and
os.replace locally; one single-request upload on GCS, which publishes an object whole or not at
all). `create_exclusive` creates a file only if it does not exist (a hard link of a written
temporary file locally, O_EXCL where the file system has no hard links; the
`ifGenerationMatch=0` precondition on GCS): the writer lock rests on it. GCS has no append and
no atomic rename of a directory: callers rewrite small files whole and move trees by copy and
delete.

Glob characters (`[ ] * ?`) in a path: orbax globs inside its checkpoint directories, so it
cannot write under such a path. A local one is handed to orbax through a link without them
(`orbax_dir`, in a private directory of this user's: `link_root`); a gs:// one is refused before
any work by `check_orbax_path`, as is a gs:// one with `#`, `?` or a control character, which
orbax's URL parsing cuts or drops (`url_chars`; local paths reach tensorstore's file driver as
written and need nothing).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import posixpath
import shutil
import stat
import tempfile
import time
import uuid
from typing import Callable, Optional, Union

from rove_jax.storage.errors import is_storage_error, is_unavailable  # noqa: F401

REMOTE_SCHEMES = ("gs://",)
GLOB_CHARS = "[]*?"
GCS_EXTRA = "pip install 'rove_jax[gcs]'"


class MissingExtra(ImportError):
  """A remote path whose storage library is not installed."""


def describe_failure(e: BaseException, path: str) -> str:
  """Why reading or writing under `path` failed, in a few words on one line."""
  if is_remote(path) and isinstance(e, FileNotFoundError):  # gcsfs's 404 names only a URL
    bucket = path[len("gs://") :].split("/", 1)[0]
    return f"the bucket gs://{bucket} does not exist or these credentials cannot reach it"
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  return " ".join(str(e).split()) or type(e).__name__


def is_remote(path: str) -> bool:
  return str(path).startswith(REMOTE_SCHEMES)


def _scheme(path: str) -> Optional[str]:
  head, sep, _ = str(path).partition("://")
  return head if sep and head.isalnum() else None


def resolve(path, *, what: str = "path") -> str:
  """The canonical form of a location: gs://bucket/key (no trailing slash) or an absolute local
  path. Raises MissingExtra for gs:// without gcsfs and ValueError for other URL schemes, before
  any work starts."""
  path = os.fspath(path)
  scheme = _scheme(path)
  if scheme is None:
    return os.path.abspath(os.path.expanduser(path))
  if scheme != "gs":
    raise ValueError(
      f"{what} {path}: the {scheme}:// scheme is not supported; use a local "
      f"path or gs://bucket/path"
    )
  if importlib.util.find_spec("gcsfs") is None:
    raise MissingExtra(
      f"{what} {path} is on Google Cloud Storage, which needs gcsfs: {GCS_EXTRA}", name="gcsfs"
    )
  bucket, _, key = path[len("gs://") :].partition("/")
  if not bucket:
    raise ValueError(f"{what} {path}: no bucket name; give gs://BUCKET/path")
  key = posixpath.normpath(key).lstrip("/") if key.strip("/") else ""
  return f"gs://{bucket}/{key}".rstrip("/") if key not in ("", ".") else f"gs://{bucket}"


def join(base: str, *parts: str) -> str:
  return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


def basename(path: str) -> str:
  return posixpath.basename(str(path).rstrip("/"))


def dirname(path: str) -> str:
  return posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)


def inside(directory: str, name, *, what: str) -> str:
  """The path of the file `name` that a file inside `directory` names (a shard in an index, a
  tokenizer in a config.json): a relative path that stays inside it. Anything else (not a
  string, empty, absolute, a scheme, `..` among its parts) is a ValueError naming `what`, so a
  model directory cannot make a reader open files elsewhere. Symbolic links inside it are
  followed as they are (the Hugging Face cache links every file to a blob outside it).
  """
  bad = None
  if not isinstance(name, str) or not name.strip():
    bad = "is not a file name"
  elif name.startswith(("/", "\\")) or os.path.isabs(name) or _scheme(name):
    bad = "is an absolute path"
  elif ".." in name.replace("\\", "/").split("/"):
    bad = "leads outside it (..)"
  elif "\0" in name:
    bad = "holds a NUL character"
  if bad:
    raise ValueError(
      f"{what} {name!r} {bad}: a file named inside {directory} must be a "
      f"relative path inside that directory"
    )
  return join(directory, name)


def glob_chars(path: str) -> str:
  """The glob characters in `path` (empty when there are none)."""
  return "".join(sorted({c for c in str(path) if c in GLOB_CHARS}))


def url_chars(path: str) -> str:
  """The characters of a gs:// `path` that orbax's URL parsing does not keep in the object name
  (empty when there are none or the path is local): `#` and `?` end the path there (fragment
  and query), and tabs and line breaks are dropped; other control characters are refused too.
  `%`, spaces and the rest reach tensorstore and gcsfs alike, as written."""
  if not is_remote(path):
    return ""
  return "".join(sorted({c for c in str(path) if c in "#?" or ord(c) < 0x20 or c == "\x7f"}))


def check_orbax_path(path: str, *, what: str = "--workdir") -> None:
  """Raises ValueError when orbax cannot write checkpoints under `path`: a gs:// path with glob
  characters (orbax lists its files by glob patterns built from the path), or with a character
  its URL parsing cuts or drops (`url_chars`: the arrays would be written elsewhere than the
  rest of the checkpoint)."""
  cut = url_chars(path)
  if cut:
    raise ValueError(
      f"{what} {path} contains {', '.join(repr(c) for c in cut)}: orbax reads a "
      f"gs:// path as a URL, which ends the path at '#' or '?' and drops "
      f"control characters, so the arrays would be written outside the workdir; "
      f"choose a name without them (e.g. run-1 for run#1)"
    )
  chars = glob_chars(path)
  if chars and is_remote(path):
    raise ValueError(
      f"{what} {path} contains {' '.join(repr(c) for c in chars)}: orbax finds "
      f"the files of a checkpoint on GCS by glob patterns, which such a name "
      f"breaks; choose a name without [ ] * ? (e.g. lr3e-4 for lr[3e-4])"
    )


def orbax_dir(path: str) -> str:
  """The name to give orbax for the directory `path`: itself, or for a local path with glob
  characters a link to it (in `link_root()`, named by a digest of the real path) that has none.
  The directory is created."""
  makedirs(path)
  if not glob_chars(path) or is_remote(path):
    check_orbax_path(path)
    return path
  real = os.path.realpath(path)
  root = link_root()
  link = os.path.join(root, hashlib.sha256(real.encode()).hexdigest()[:24])
  if not (os.path.islink(link) and os.readlink(link) == real):
    tmp = f"{link}.{uuid.uuid4().hex}"
    os.symlink(real, tmp)
    os.replace(tmp, link)
  return link


def link_root() -> str:
  """This user's directory of links for `orbax_dir`: TMPDIR/rove-jax-links-<uid>, created
  private (mode 0700). Every checkpoint of a glob-named workdir is written through a link
  there, so a directory another user could write in (theirs, a symlink to elsewhere, one with
  group or other write permission) would let them redirect checkpoints: it is refused. One of
  ours that others can only read (made by an older version under umask 022) is closed to 0700,
  since nobody else could have changed its links."""
  root = os.path.join(tempfile.gettempdir(), f"rove-jax-links-{os.getuid()}")
  if glob_chars(root):
    raise ValueError(f"the temporary directory {root} contains glob characters; set TMPDIR")
  try:
    os.mkdir(root, 0o700)
  except FileExistsError:
    pass
  st = os.lstat(root)
  fix = f"remove it (rm -r '{root}') or set TMPDIR to a directory only you can write"
  if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
    raise PermissionError(
      f"the checkpoint link directory {root} is {kind}, not a directory of this user's; {fix}"
    )
  if st.st_uid != os.getuid():
    raise PermissionError(
      f"the checkpoint link directory {root} belongs to uid {st.st_uid}, not "
      f"this user (uid {os.getuid()}), who could redirect checkpoints; {fix}"
    )
  if st.st_mode & 0o022:
    raise PermissionError(
      f"the checkpoint link directory {root} is writable by other users "
      f"(mode {stat.S_IMODE(st.st_mode):04o}), who could redirect "
      f"checkpoints; {fix}"
    )
  if st.st_mode & 0o077:
    os.chmod(root, 0o700)
  return root


# ----------------------------------------------------------------------------- operations


def _gcs():
  from rove_jax.storage import gcs

  return gcs


def forget_listings(path: str) -> None:
  """For a remote path: makes the listings orbax caches see the objects as they are now (call
  it before opening orbax on a directory this layer changed)."""
  if is_remote(path):
    _gcs().forget_listings()


def exists(path: str) -> bool:
  return _gcs().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _gcs().isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return _gcs().isfile(path) if is_remote(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  """The names in a directory ([] when it does not exist)."""
  if is_remote(path):
    return _gcs().listdir(path)
  return sorted(os.listdir(path)) if os.path.isdir(path) else []


def file_sizes(path: str) -> dict[str, int]:
  """{name: size in bytes} of the files directly in a directory ({} when it does not exist);
  on GCS one listing request rather than one request a file."""
  if is_remote(path):
    return _gcs().file_sizes(path)
  if not os.path.isdir(path):
    return {}
  return {e.name: e.stat().st_size for e in os.scandir(path) if e.is_file()}


def makedirs(path: str) -> None:
  """Creates a directory and its parents (GCS has no directories: nothing to do)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def remove(path: str, *, missing_ok: bool = True) -> None:
  try:
    _gcs().remove(path) if is_remote(path) else os.remove(path)
  except FileNotFoundError:
    if not missing_ok:
      raise


def rmtree(path: str) -> None:
  if is_remote(path):
    _gcs().rmtree(path)
  else:
    shutil.rmtree(path, ignore_errors=True)


def size(path: str) -> int:
  return _gcs().size(path) if is_remote(path) else os.path.getsize(path)


def read_bytes(path: str) -> bytes:
  if is_remote(path):
    return _gcs().read_bytes(path)
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def open_read(path: str):
  """A binary file object for reading (seekable on both backends)."""
  return _gcs().open_read(path) if is_remote(path) else open(path, "rb")


Writer = Callable[[object], object]


def write_atomic(path: str, data: Union[bytes, str, Writer]) -> int:
  """Replaces the file at `path` whole: readers see the old file or the new one, never a part.
  `data` is bytes, text (UTF-8) or a function that writes into a binary file object. Returns
  the size written."""
  if isinstance(data, str):
    data = data.encode("utf-8")
  if is_remote(path):
    if callable(data):
      import io

      buf = io.BytesIO()
      data(buf)
      data = buf.getvalue()
    _gcs().write(path, data)
    return len(data)
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
  try:
    with open(tmp, "wb") as f:
      if callable(data):
        data(f)
      else:
        f.write(data)
      f.flush()
      os.fsync(f.fileno())
      written = f.tell()
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return written


def create_exclusive(path: str, data: Union[bytes, str]) -> bool:
  """Creates `path` holding `data` if no file is there; False if one is (nothing written).
  Exactly one of several concurrent callers for one path gets True."""
  if isinstance(data, str):
    data = data.encode("utf-8")
  if is_remote(path):
    return _gcs().create_exclusive(path, data)
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  # Written whole under a temporary name, then hard-linked to `path`: link(2) fails when the
  # name exists, so the file appears with its contents or not at all (an O_EXCL create would
  # show other readers an empty file until the write).
  tmp = os.path.join(directory, f".{os.path.basename(path)}.new-{uuid.uuid4().hex[:12]}")
  with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  try:
    os.link(tmp, path)
  except FileExistsError:
    return False
  except OSError:  # a file system without hard links (some FUSE mounts): O_EXCL, then write
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
  finally:
    os.remove(tmp)
  return True


def mtime(path: str) -> float:
  """When the file was last written, by the storage's clock (seconds since the epoch)."""
  return _gcs().mtime(path) if is_remote(path) else os.stat(path).st_mtime


def storage_now(directory: str) -> float:
  """The storage's clock now: the modification time of a probe file written in `directory`
  (and removed). Comparing it with `mtime` of another file there measures an age that does not
  depend on the clock of the machine asking."""
  probe = join(directory, f".clock-probe-{uuid.uuid4().hex[:12]}")
  write_atomic(probe, b"")
  try:
    return mtime(probe)
  finally:
    remove(probe)


def copy_tree(src: str, dst: str) -> None:
  """Copies a directory tree (either side local or remote)."""
  if not is_remote(src) and not is_remote(dst):
    shutil.copytree(src, dst)
    return
  for rel in walk_files(src):
    write_atomic(join(dst, *rel.split("/")), read_bytes(join(src, *rel.split("/"))))


def move_tree(src: str, dst: str) -> None:
  """Moves a directory tree: a rename locally, copy then delete on GCS."""
  if not is_remote(src) and not is_remote(dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.move(src, dst)
    return
  copy_tree(src, dst)
  rmtree(src)


def walk_files(root: str) -> list[str]:
  """Every file under `root`, as '/'-separated paths relative to it, sorted."""
  if is_remote(root):
    return _gcs().walk_files(root)
  out = []
  for dirpath, _, names in os.walk(root):
    for name in names:
      out.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
  return sorted(out)


def local_copy(
  path: str, *, cache: Optional[str] = None, expect_size: Optional[int] = None, log=None
) -> str:
  """A local file holding the contents of `path`: `path` itself when local; for a remote file a
  copy in `cache` (default: the user's cache directory), reused while its size and the
  remote file's modification time are unchanged."""
  if not is_remote(path):
    return path
  cache = cache or os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rove_jax", "remote"
  )
  stamp = f"{path}@{mtime(path)}"
  local = os.path.join(cache, hashlib.sha256(stamp.encode()).hexdigest()[:24], basename(path))
  want = expect_size if expect_size is not None else size(path)
  if os.path.isfile(local) and os.path.getsize(local) == want:
    return local
  if log is not None:
    log(f"copying {path} ({want / 2**20:.1f} MiB) to {local}")
  t = time.perf_counter()
  write_atomic(local, lambda f: _gcs().download_into(path, f))
  if log is not None:
    log(f"copied in {time.perf_counter() - t:.1f} s")
  return local
