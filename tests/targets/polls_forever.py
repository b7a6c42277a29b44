"""The main thread polls a flag that nothing ever sets: it wakes up a hundred times a second on
one `time.sleep` line and never gets anywhere. It says "ready" from inside the loop."""

import sys
import threading
import time

done = threading.Event()
announced = False
while not done.is_set():
    time.sleep(0.01)
    if not announced:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        announced = True
