"""Holds the GIL for a second in a C call, then exits: it dies while an agent waits to start."""

import ctypes
import os
import sys

sys.setswitchinterval(1000.0)
libc = ctypes.PyDLL(None)
libc.write(1, b"ready\n", 6)
libc.sleep(1)
os._exit(0)
