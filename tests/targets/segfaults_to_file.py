"""Arms faulthandler on the file named by argv[1] as the agent does (a `#probing-fatal 1 {json}`
header line first, then faulthandler on the same descriptor), starts a named thread that waits,
and dies of SIGSEGV inside `read_address`, a called function (ctypes.string_at(0)).
Runs to its death: nothing to wait for."""

import ctypes
import faulthandler
import json
import os
import socket
import sys
import threading
import time

path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
header = {
    "record": 1,
    "probing_version": "test",
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "uid": os.geteuid(),
    "hostname": socket.gethostname(),
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "executable": sys.executable,
    "python_version": ".".join(map(str, sys.version_info[:3])),
    "started_at": None,
    "written_at": time.time(),
    "reason": {"kind": "fatal_signal", "message": "", "signal": None, "exit_status": None},
    "exception": None,
    "rank": None,
    "tables": [],
    "notes": [],
    "write_seconds": 0.0,
}
os.write(fd, b"#probing-fatal 1 " + json.dumps(header).encode() + b"\n")
faulthandler.enable(os.fdopen(fd, "w"), all_threads=True)
waiting = threading.Event()
threading.Thread(target=waiting.wait, name="loader", daemon=True).start()


def read_address(address):
    return ctypes.string_at(address)


def step(number):
    return read_address(0)


step(7)
