"""A job whose data loading calls into native code that crashes (a NULL pointer read through
ctypes, as a buggy extension would): SIGSEGV, no Python exception. The user guide's
post-mortem reads the .fatal file the agent armed.

    PROBING=1 python docs/examples/segfault.py
"""

import ctypes
import threading


def decode_sample(index: int) -> bytes:
    text = ctypes.create_string_buffer(b"sample")
    address = 0 if index == 3 else ctypes.addressof(text)
    return ctypes.string_at(address)  # the "extension" reads through a bad pointer


def load_batch(indices: range) -> list:
    return [decode_sample(index) for index in indices]


done = threading.Event()
threading.Thread(target=done.wait, name="prefetcher", daemon=True).start()
for batch in range(10):
    load_batch(range(batch * 2, batch * 2 + 2))
