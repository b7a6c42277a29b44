"""The issue's core scenario: one thread holds the GIL inside a C call that sleeps (no CPU),
and the main thread joins it. Nothing in this process can move.

The holder cannot print once it is inside the C call (printing needs the GIL, and the
holder has it), so it writes "ready" through write(2) just before the call; the test then
waits, bounded, until py-spy sees that thread holding the GIL. The switch interval stays at
its default: the main thread and any helper thread that asks for the GIL keep waking up to
request it, which must not read as progress.
"""

import ctypes
import sys
import threading

seconds = int(sys.argv[1]) if sys.argv[1:] else 3600


def hold_the_gil() -> None:
    libc = ctypes.PyDLL(None)  # PyDLL: the GIL is not released around the call
    libc.write(1, b"ready\n", 6)
    libc.sleep(seconds)


holder = threading.Thread(target=hold_the_gil, name="gil-holder")
holder.start()
holder.join()
