"""Forks a child (as a DataLoader worker is forked) that waits until told to exit; the child
then leaves through sys.exit, so the atexit handlers it inherited run in it."""

import os
import sys

read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    os.close(write_end)
    os.read(read_end, 1)
    sys.exit(0)

os.close(read_end)
print("ready child=%d" % child, flush=True)
for line in sys.stdin:
    if line.strip() == "release-child":
        os.close(write_end)
        os.waitpid(child, 0)
        print("child exited", flush=True)
