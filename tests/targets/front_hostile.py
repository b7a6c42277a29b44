"""Names that are not text: a thread, a function and a file name carrying lone surrogates (the
bytes of a non-UTF-8 name, decoded with surrogateescape), C1 controls and a line separator,
and a real source file whose name is not UTF-8. Prints "ready" once that thread waits in that
function. Exits when its stdin closes."""

import os
import sys
import tempfile
import threading

ODD = "\udcff\udc9b[31m\x85\u2028\udc80"
folder = tempfile.mkdtemp()
path = os.path.join(folder, os.fsdecode(b"job-\xff\xfe.py"))
with open(path, "w") as source:
    source.write("def waiting(started, stop):\n    started.set()\n    stop.wait()  # \u00e9\u2028\n")
namespace: dict = {}
exec(compile(open(path).read(), path, "exec"), namespace)
waiting = namespace["waiting"]
waiting.__code__ = waiting.__code__.replace(co_name="wait" + ODD)

started, stop = threading.Event(), threading.Event()
thread = threading.Thread(target=waiting, args=(started, stop), name="odd" + ODD, daemon=True)
thread.start()
started.wait()
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    pass
stop.set()
os.unlink(path)
os.rmdir(folder)
