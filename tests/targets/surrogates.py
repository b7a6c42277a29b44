"""Text that is not UTF-8 anywhere a job can put it: lone surrogates, as a job leaves them after
decoding half an emoji from JSON (json.loads('"\\ud83d"')) or a name of bytes that are not
UTF-8 with surrogateescape. They are in sys.argv (process.info, the `hello` of every command), a
thread's name, a local's value and a __repr__ of the job's own (--locals). Prints "ready" once
the main thread waits in main_loop() with those locals. Exits when its stdin closes."""

import json
import os
import sys
import threading

HALF_EMOJI = json.loads('"caf\\ud83d"')  # a high surrogate with no low one after it
ODD = HALF_EMOJI + "-\udc00-\udcff-\udfff"
sys.argv.append(ODD)


class OddRepr:
    def __repr__(self):
        return "odd " + ODD


def waiting(stop):
    stop.wait()


def main_loop():
    text = ODD  # noqa: F841 - locals for --locals
    odd = OddRepr()  # noqa: F841
    keyed = {ODD: ODD}  # noqa: F841
    print("ready", os.getpid(), flush=True)
    for _ in sys.stdin:
        pass


stop = threading.Event()
thread = threading.Thread(target=waiting, args=(stop,), name="worker-" + ODD, daemon=True)
thread.start()
main_loop()
stop.set()
