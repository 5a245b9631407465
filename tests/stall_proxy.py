"""A TCP proxy in front of the tests' GCS API server that can stop answering.

Forwarding, it passes bytes both ways unchanged. After `stall()` it still accepts connections
but never answers on them, and the connections already open stop forwarding too: storage that
has gone silent (a dead network, a hung server), the failure no retry or error reaches. The
server behind it keeps running, so a test can look at what was stored through the server's
own address.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse


class StallProxy:
  def __init__(self, target_url: str):
    parsed = urllib.parse.urlparse(target_url)
    self._target = (parsed.hostname, parsed.port)
    self._listener = socket.socket()
    self._listener.bind(("127.0.0.1", 0))
    self._listener.listen(128)
    self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
    self._silent = threading.Event()
    self._held: list[socket.socket] = []  # sockets kept open, never answered
    threading.Thread(target=self._accept, daemon=True).start()

  def stall(self) -> None:
    self._silent.set()

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
      try:
        upstream = socket.create_connection(self._target)
      except OSError:
        client.close()
        continue
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
