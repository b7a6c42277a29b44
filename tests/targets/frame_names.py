"""Names that live in frames, not in __main__: for eval's and repl's name resolution.

    MainThread  main() > train():  loss = 2.5, batch = "main batch", shared (one object),
                                   a `state` cell read by a closure
    loader      load():            batch = "loader batch", queue_depth = 7, shared (the same object)

`counter` is the one global besides the functions. Prints `ready` once every frame above
holds its names; exits when stdin closes.
"""

import sys
import threading

stop = threading.Event()
counter = 1


class Shared:
    def __repr__(self) -> str:
        return "<the shared object>"


def load(shared: Shared, ready: threading.Event) -> None:
    batch = "loader batch"
    queue_depth = 7
    ready.set()
    stop.wait()
    print(batch, queue_depth, shared)


def train(shared: Shared) -> None:
    loss = 2.5
    batch = "main batch"
    state = {"epoch": 3}

    def report() -> str:
        return f"{state} {loss}"

    loader_ready = threading.Event()
    threading.Thread(target=load, args=(shared, loader_ready), name="loader", daemon=True).start()
    loader_ready.wait()
    print("ready", flush=True)
    for _ in sys.stdin:
        pass
    stop.set()
    print(report(), batch)


def main() -> None:
    train(Shared())


main()
