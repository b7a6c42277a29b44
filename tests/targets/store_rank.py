"""A torchrun-like rank at rest whose job has imported torch.distributed (so that its agent
uses the job's store). With --own-store it also runs the job's store itself (a TCPStore master
on 127.0.0.1, any free port, put into MASTER_ADDR/MASTER_PORT before "ready"); without it,
the store is wherever MASTER_ADDR/MASTER_PORT say (a stopped one, a silent one). With --serve
it is only that store: "ready PID PORT", nothing else. Prints "ready PID PORT" once the store
exists (or at once); exits when its stdin closes."""

import os
import sys
from datetime import timedelta

import torch.distributed as dist

store = None
port = os.environ.get("MASTER_PORT", "")
if "--own-store" in sys.argv or "--serve" in sys.argv:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    port = str(store.port)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
print("ready", os.getpid(), port, flush=True)
sys.stdin.read()
