"""A job that traces and profiles every thread it starts from now on, as `python -m trace`,
coverage's PyTracer or a pure-Python debugger does (threading.settrace/setprofile), and whose
`loss` is a local of train(). Prints `ready` once train() holds it; exits when stdin closes."""

import sys
import threading


def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
    return tracer  # a line tracer: called before every line of every frame it sees


def profiler(frame, event, arg):  # type: ignore[no-untyped-def]
    return None


threading.settrace(tracer)
threading.setprofile(profiler)


def train() -> None:
    loss = 0.25
    print("ready", flush=True)
    for _ in sys.stdin:
        pass
    print(loss)


train()
