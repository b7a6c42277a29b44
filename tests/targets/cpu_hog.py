"""Load for a loaded machine: spins on one core for the number of seconds given (default 120),
then exits by itself, so that a test that dies leaves no hog behind for long. "ready" once it
spins."""

import sys
import time

end = time.monotonic() + (float(sys.argv[1]) if sys.argv[1:] else 120.0)
print("ready", flush=True)
while time.monotonic() < end:
    pass
