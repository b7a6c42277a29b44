"""A job whose only work is a heartbeat: a thread that wakes every millisecond and keeps the
longest gap between two wake-ups (how long the job was held still), and the longest such gap
less the time the thread spent waiting for a CPU (its run_delay in /proc/.../schedstat): what
is left was spent waiting inside the process (for the GIL), where an agent thread could hold
it, rather than for a core that other processes took. Each line on stdin is a question: the job
prints `stall GAP HELD BEATS` (seconds, seconds, count: all since the last question) and starts
measuring afresh. Ready once the heartbeat runs; exits when its stdin closes."""

import os
import sys
import threading
import time

lock = threading.Lock()
longest = 0.0
longest_held = 0.0
beats = 0
started = threading.Event()


def waited_for_a_cpu(schedstat):
    try:
        return int(os.pread(schedstat, 100, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0  # no schedstat: every gap counts as held


def heartbeat():
    global longest, longest_held, beats
    schedstat = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    last = time.monotonic()
    last_delay = waited_for_a_cpu(schedstat)
    started.set()
    while True:
        time.sleep(0.001)
        now = time.monotonic()
        delay = waited_for_a_cpu(schedstat)
        with lock:
            longest = max(longest, now - last)
            longest_held = max(longest_held, now - last - (delay - last_delay))
            beats += 1
        last, last_delay = now, delay


threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
started.wait()
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    with lock:
        answer = f"stall {longest:.6f} {longest_held:.6f} {beats}"
        longest = longest_held = 0.0
        beats = 0
    print(answer, flush=True)
