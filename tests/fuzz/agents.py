"""Fake agents for the fuzz tests: peers that answer the CLI with an input's bytes. They listen in
the test process, so a Client's checks of the socket and of the peer (its PID, its uid) pass."""

from __future__ import annotations

import os
import socket
import threading
from typing import Callable

# The token of the captured TCP sessions (capture_corpus.py TOKEN).
TOKEN = "probing fuzz corpus token, not a secret"


class FakeAgent:
    """Serves connections one at a time: sends `reply`, ends its side of the stream and waits
    for the client to hang up (closing first would make the client's send fail before it reads)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, f"{os.getpid()}.sock")
        self.reply = b""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, name="fuzz-fake-agent", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(15)
                try:
                    connection.sendall(self.reply)
                    connection.shutdown(socket.SHUT_WR)
                    while connection.recv(1 << 16):
                        pass
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(10)
        os.unlink(self.path)


class FakeTcpAgent:
    """Listens on loopback; each connection is handed to `serve(connection)`, then the agent
    ends its side and waits for the client to hang up."""

    def __init__(self) -> None:
        self.serve: Callable[[socket.socket], None] = lambda connection: None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._run, name="fuzz-fake-tcp-agent", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(15)
                try:
                    self.serve(connection)
                    connection.shutdown(socket.SHUT_WR)
                    while connection.recv(1 << 16):
                        pass
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(10)
