"""A TCP proxy in front of the tests' GCS API server that can stop answering, or refuse writes.

Forwarding, it passes bytes both ways unchanged. After `stall()` it still accepts connections
but never answers on them, and the connections already open stop forwarding too: storage that
has gone silent (a dead network, a hung server), the failure no retry or error reaches. After
`fail_writes(status)` every request that writes (POST, PUT, PATCH, DELETE) is answered with
that HTTP status and a GCS-style JSON error, and reads still reach the server: a bucket that
became read-only (403) or a server that errs on writes (503). The server behind it keeps
running, so a test can look at what was stored through the server's own address.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse

WRITES = (b"POST", b"PUT", b"PATCH", b"DELETE")


class StallProxy:
  def __init__(self, target_url: str):
    parsed = urllib.parse.urlparse(target_url)
    self._target = (parsed.hostname, parsed.port)
    self._listener = socket.socket()
    self._listener.bind(("127.0.0.1", 0))
    self._listener.listen(128)
    self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
    self._silent = threading.Event()
    self._fail_status = None  # set: writes are refused with this status
    self._held: list[socket.socket] = []  # sockets kept open, never answered
    self._open: list[socket.socket] = []  # forwarding connections (cut by fail_writes)
    threading.Thread(target=self._accept, daemon=True).start()

  def stall(self) -> None:
    self._silent.set()

  def fail_writes(self, status: int) -> None:
    """From now on (new connections; open ones are cut) writes get `status`."""
    self._fail_status = status
    for s in list(self._open):
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  def close(self) -> None:
    self._listener.close()
    for s in self._held:
      s.close()

  def _accept(self) -> None:
    while True:
      try:
        client, _ = self._listener.accept()
      except OSError:  # closed
        return
      if self._silent.is_set():
        self._held.append(client)
        continue
      if self._fail_status is not None:
        threading.Thread(target=self._one_request, args=(client,), daemon=True).start()
        continue
      try:
        upstream = socket.create_connection(self._target)
      except OSError:
        client.close()
        continue
      self._open.extend((client, upstream))
      for src, dst in ((client, upstream), (upstream, client)):
        threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

  def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
    while True:
      try:
        data = src.recv(65536)
      except OSError:
        return
      if self._silent.is_set():  # hold the connection open, forward nothing more
        self._held.extend((src, dst))
        return
      if not data:
        try:
          dst.shutdown(socket.SHUT_WR)
        except OSError:
          pass
        return
      try:
        dst.sendall(data)
      except OSError:
        return

  def _one_request(self, client: socket.socket) -> None:
    """Reads one request; refuses it if it writes, else relays it alone to the server (the
    connection is closed after the answer, so the next request comes here again)."""
    with client:
      head, body = _read_request(client)
      if head is None:
        return
      if head.split(b" ", 1)[0] in WRITES:
        status = self._fail_status
        payload = json.dumps(
          {"error": {"code": status, "message": "injected", "errors": [{"message": "injected"}]}}
        ).encode()
        client.sendall(
          b"HTTP/1.1 %d Injected\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(payload)) + payload
        )
        return
      lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(b"connection:")]
      with socket.create_connection(self._target) as upstream:
        upstream.sendall(b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + body)
        while True:
          data = upstream.recv(65536)
          if not data:
            return
          client.sendall(data)


def _read_request(sock: socket.socket):
  """(head without its blank line, body) of one HTTP request; (None, None) on a closed
  connection. Bodies come with Content-Length or chunked."""
  buf = b""
  while b"\r\n\r\n" not in buf:
    data = sock.recv(65536)
    if not data:
      return None, None
    buf += data
  head, _, rest = buf.partition(b"\r\n\r\n")
  fields = {}
  for line in head.split(b"\r\n")[1:]:
    name, _, value = line.partition(b":")
    fields[name.strip().lower()] = value.strip()
  if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
    while not rest.endswith(b"0\r\n\r\n"):
      data = sock.recv(65536)
      if not data:
        break
      rest += data
    return head, rest
  length = int(fields.get(b"content-length", b"0") or 0)
  while len(rest) < length:
    data = sock.recv(65536)
    if not data:
      break
    rest += data
  return head, rest
