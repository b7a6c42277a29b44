"""A thread holds the GIL inside a C call (a C extension stuck without releasing it), for the
number of seconds given (default: an hour), then lets go; the job then exits normally when
its stdin closes.

The holder stretches the switch interval first, so no other thread (the agent included)
can take the GIL between its calls, then announces itself through write(2), not print():
print would release the GIL while writing.
"""

import ctypes
import sys
import threading

seconds = int(sys.argv[1]) if sys.argv[1:] else 3600


def hold_the_gil_forever():
    sys.setswitchinterval(1000.0)
    libc = ctypes.PyDLL(None)
    libc.write(1, b"ready\n", 6)
    libc.sleep(seconds)
    sys.setswitchinterval(0.005)


threading.Thread(target=hold_the_gil_forever, name="gil-holder", daemon=True).start()
for _ in sys.stdin:
    pass
