"""Works in small steps for the number of seconds given (default 1.5) after saying ready, then
exits: it dies while a flame graph samples it."""

import sys
import time

seconds = float(sys.argv[1]) if sys.argv[1:] else 1.5
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    sum(range(1000))
    time.sleep(0.001)
