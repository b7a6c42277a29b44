"""The main thread blocked inside a C call that released the GIL (as an NCCL wait does)."""

import ctypes

print("ready", flush=True)
ctypes.CDLL(None).sleep(3600)
