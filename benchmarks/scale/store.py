"""The job's rendezvous store, as torchrun's launcher on the head node runs it: torch's TCPStore
server on a loopback address, on a free port.

    python benchmarks/scale/store.py HOST

Prints `store PORT` once it serves, and ends when its stdin closes (or after an hour).
"""

from __future__ import annotations

import os
import select
import sys
from datetime import timedelta

LIFETIME_S = 3600.0


def main() -> None:
    import torch.distributed as dist

    host = sys.argv[1]
    if not host.startswith("127."):
        raise SystemExit(f"the harness's store serves on loopback only, not {host}")
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    os.write(1, f"store {store.port}\n".encode())
    select.select([sys.stdin.fileno()], [], [], LIFETIME_S)  # the harness never writes: EOF ends it


if __name__ == "__main__":
    main()
