"""What sealing every TCP record (protocol/sealed.py) costs.

1. The record layer alone: one large reply frame (a table-sized payload in many small chunks and
   one large one) sent with frames.send_frame and read with the CLI's ReplyReader over a
   socketpair, raw vs sealed, same run. Ratio of the medians, and the sealed throughput.
2. End to end: `eval` of a large value from a listening job (tests/targets/sleeper.py), over its
   Unix socket (no records) vs tcp:// on 127.0.0.1 (handshake + sealed records), same job.
3. Memory: what importing protocol/sealed.py adds to a process that has already loaded what the
   listener loads (socket, selectors, auth with the built-in SHA-256): modules and RSS.

    .venv/bin/python benchmarks/bench_sealed.py [--megabytes 64] [--runs 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from probing.client.replies import ReplyReader  # noqa: E402
from probing.protocol import auth, sealed  # noqa: E402
from probing.protocol.frames import MAX_REPLY_BYTES, send_frame  # noqa: E402

TOKEN = "bench-sealed-token-0123456789abcdef"


BUILT_IN = auth._sha256


def one_transfer(payload: List[bytes], seal: Optional[Tuple[Any, Any]]) -> float:
    """Seconds to send one frame and read it whole; `seal`: the SHA-256 of (agent, CLI), or raw."""
    a, b = socket.socketpair()
    if seal is not None:
        key = os.urandom(32)
        a = sealed.SealedSocket(a, key, sealed.AGENT, sha256=seal[0])
        b = sealed.SealedSocket(b, key, sealed.CLIENT, sha256=seal[1])
    try:
        started = time.perf_counter()
        sender = threading.Thread(target=send_frame, args=(a, {"id": 1, "ok": True}, payload))
        sender.start()
        frame = ReplyReader(b, MAX_REPLY_BYTES).read(120.0)
        sender.join()
        elapsed = time.perf_counter() - started
        assert frame is not None and len(frame.payload) == sum(len(chunk) for chunk in payload)
        return elapsed
    finally:
        a.close()
        b.close()


def median_of(runs: int, work: Callable[[], float]) -> float:
    return statistics.median(work() for _ in range(runs))


def record_layer(megabytes: int, runs: int) -> None:
    # Like a table reply: many column chunks of a few KB, and one big block.
    payload = [os.urandom(4096) for _ in range(1024)] + [os.urandom((megabytes << 20) - (4 << 20))]
    size = sum(len(chunk) for chunk in payload) / 1e6
    raw = median_of(runs, lambda: one_transfer(payload, None))
    print(f"1. one {size:.0f} MB frame over a socketpair, both ends in this process (median of {runs})")
    print(f"   {'raw':35} {raw * 1000:8.1f} ms  ({size / raw:5.0f} MB/s)")
    for name, hashes in (
        ("sealed, agent built-in, CLI OpenSSL", (BUILT_IN, hashlib.sha256)),  # a job without torch
        ("sealed, both OpenSSL", (hashlib.sha256, hashlib.sha256)),  # a job that imported torch
        ("sealed, both built-in", (BUILT_IN, BUILT_IN)),
    ):
        took = median_of(runs, lambda hashes=hashes: one_transfer(payload, hashes))  # type: ignore[misc]
        print(f"   {name:35} {took * 1000:8.1f} ms  ({size / took:5.0f} MB/s)  {took / raw:.2f}x")


def end_to_end(runs: int) -> None:
    from probing.client.connection import Client
    from probing.client.discovery import locate_socket

    from support import Target

    os.environ["PROBING_TOKEN"] = TOKEN
    env = {"PROBING_LISTEN": "127.0.0.1:0", "PROBING_TOKEN": TOKEN}
    code = "'x' * 4_000_000"  # eval's value is capped at 4 Mi characters
    with Target("sleeper.py", via="env", env=env) as target:
        path = locate_socket(target.pid)
        with Client(path, 30.0, pid=target.pid) as client:
            client.call("ping")
            url = f"tcp://{client.info['listener']['endpoint']}"

        def call(where: str) -> float:
            started = time.perf_counter()
            with Client(where, 60.0, pid=target.pid if where == path else None) as client:
                _, payload = client.call("eval", {"code": code}, timeout=60.0)
            assert len(payload) >= 4_000_000
            return time.perf_counter() - started

        call(path), call(url)  # warm: the agent loads its eval machinery once
        unix = median_of(runs, lambda: call(path))
        tcp = median_of(runs, lambda: call(url))
    print(f"2. eval of a 4 MB string, connect to last byte, job without torch (median of {runs})")
    print(f"   Unix socket          {unix * 1000:8.1f} ms")
    print(f"   tcp:// sealed        {tcp * 1000:8.1f} ms  {tcp / unix:.2f}x")


PROBE = """
import sys
def rss():
    with open('/proc/self/statm') as statm:
        return int(statm.read().split()[1]) * 4096
import selectors, socket, struct, threading
import tracemalloc
from probing.protocol import auth
tracemalloc.start()
before, modules = rss(), set(sys.modules)
from probing.protocol import sealed
print(rss() - before, tracemalloc.get_traced_memory()[0], sorted(set(sys.modules) - modules),
      'hashlib' in sys.modules, '_hashlib' in sys.modules)
"""


def memory() -> None:
    # From outside the source tree: the installed package and its compiled files, as a job has them.
    output = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=tempfile.gettempdir()
    ).stdout.split(" ", 2)
    print("3. importing protocol/sealed.py after what the listener already loads (installed package)")
    print(
        f"   RSS +{int(output[0]) / 1024:.0f} KiB (Python objects {int(output[1]) / 1024:.0f} KiB); "
        f"new modules, hashlib loaded, _hashlib loaded: {output[2].strip()}"
    )
    print(
        f"   per connection: at most one record ({sealed.MAX_RECORD_BYTES >> 20} MiB) plus a read-ahead "
        "buffered while it arrives; the MAC state is two SHA-256 objects"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}")
    record_layer(args.megabytes, args.runs)
    end_to_end(args.runs)
    memory()


if __name__ == "__main__":
    main()
