"""A main thread 5 000 Python frames deep, waiting on stdin at the bottom (py-spy --native
gives up on stacks this deep). Exits when its stdin closes."""

import os
import sys

DEPTH = 5000


def descend(level):
    if level == 0:
        print("ready", os.getpid(), flush=True)
        for _ in sys.stdin:
            pass
        return 0
    return descend(level - 1) + 1


sys.setrecursionlimit(DEPTH + 1000)
descend(DEPTH)
