"""An error met reading an input blames the input (ValueError: exit 2) unless the storage
failed (exit 1): rove_jax.storage.errors.input_error."""

import errno

import pytest

from rove_jax.storage import deadline
from rove_jax.storage import errors as storage_errors


class DamagedInput(ValueError):
  pass


@pytest.mark.parametrize(
  "error",
  [
    deadline.StorageTimeout("reading gs://b/x: storage did not answer within 3 s"),
    deadline.StorageInterrupted("reading gs://b/x: a stop signal arrived"),
    OSError(errno.ENOSPC, "No space left on device"),
    ConnectionResetError("reset by peer"),
  ],
  ids=["deadline", "interrupted", "disk-full", "connection"],
)
def test_failed_storage_keeps_its_type(error):
  out = storage_errors.input_error(error, f"init_from=gs://b/x: {error}", DamagedInput)
  assert type(out) is type(error) and isinstance(out, OSError)
  assert str(out) == f"init_from=gs://b/x: {error}"


@pytest.mark.parametrize(
  "error",
  [
    FileNotFoundError(errno.ENOENT, "No such file", "gs://b/x/config.json"),
    PermissionError(errno.EACCES, "Permission denied"),
    IsADirectoryError(errno.EISDIR, "Is a directory"),
    ValueError("not JSON"),
  ],
  ids=["missing", "refused", "directory", "malformed"],
)
def test_a_wrong_or_missing_input_is_the_inputs_error(error):
  out = storage_errors.input_error(error, f"data.path=d: {error}", DamagedInput)
  assert type(out) is DamagedInput and str(out) == f"data.path=d: {error}"
  assert type(storage_errors.input_error(error, "m")) is ValueError
