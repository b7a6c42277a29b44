"""Holds an object only in a local of hold(), then drops it when told: whether anything probing
did while reading that local keeps the object alive.

Prints `ready` once `payload` exists; after a line on stdin drops it and prints `freed` or
`alive`; exits at the next line or when stdin closes.
"""

import gc
import sys
import weakref


class Payload:
    pass


def hold() -> None:
    payload = Payload()
    gone = weakref.ref(payload)
    print("ready", flush=True)
    sys.stdin.readline()
    del payload
    gc.collect()
    print("freed" if gone() is None else "alive", flush=True)
    sys.stdin.readline()


hold()
