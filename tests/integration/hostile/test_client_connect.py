"""A full listen backlog (a storm of connections) is waited out within the command's time:
connect() on a Unix socket with a timeout fails at once with EAGAIN instead of waiting."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List

from probing.client.connection import Client

from support import Target, probing


def test_a_client_waits_for_room_in_a_full_backlog_instead_of_failing() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"{os.getpid()}.sock")  # we are the process answering
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        waiting: List[socket.socket] = []
        try:
            for _ in range(64):  # fill the backlog: the kernel keeps backlog + 1 waiting
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                probe.setblocking(False)
                try:
                    probe.connect(path)
                except BlockingIOError:
                    probe.close()
                    break
                waiting.append(probe)
            else:
                raise AssertionError("the backlog never filled")
            full = threading.Event()

            def log(message: str) -> None:
                if "queue of connections is full" in message:
                    full.set()

            def drain() -> None:
                # Make room only once the client has met the full queue.
                if full.wait(10):
                    listener.setblocking(False)
                    for _ in range(len(waiting) + 1):
                        try:
                            listener.accept()[0].close()
                        except BlockingIOError:
                            break

            drainer = threading.Thread(target=drain)
            drainer.start()
            with Client(path, timeout=10.0, log=log) as client:
                assert client.path == path
            drainer.join(10)
            assert full.is_set()
        finally:
            for probe in waiting:
                probe.close()
            listener.close()


def test_forty_evals_during_a_connection_storm_all_succeed() -> None:
    with Target("sleeper.py") as job:
        path = os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{job.pid}.sock")
        stop = threading.Event()

        def storm() -> None:
            deadline = time.monotonic() + 120
            for _ in range(20000):
                if stop.is_set() or time.monotonic() > deadline:
                    return
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.setblocking(False)
                    try:
                        sock.connect(path)
                    except OSError:
                        pass

        stormers = [threading.Thread(target=storm, daemon=True) for _ in range(4)]
        for stormer in stormers:
            stormer.start()
        try:
            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(lambda _: probing(str(job.pid), "eval", "1", timeout=60), range(40)))
        finally:
            stop.set()
            for stormer in stormers:
                stormer.join(10)
        assert job.alive()
    failed = [result.stderr for result in results if result.returncode != 0 or result.stdout != "1\n"]
    assert not failed, f"{len(failed)} of 40 failed: {failed[:3]}"
