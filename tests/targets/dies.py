"""A job that ends in the way a records test asks for (issue 15).

    --torch             train a small torch model in the main thread (a step every --pause s)
    --raise-at N        raise ValueError("diverged at step N") from `check_step` at step N
    --handler FILE      a SIGTERM handler of the job's own, installed after the agent started:
                        it writes FILE and exits with status 7
    --faulthandler      the job enables faulthandler on stderr itself
    --own-excepthook    the job replaces sys.excepthook (after the agent started) with one that
                        prints `job hook: <exception>` and calls no other hook
    --wrap-excepthook   the job wraps sys.excepthook (after the agent started) with one that
                        calls the hook it found, as Sentry or wandb do

Prints `ready` once the state under test exists (torch: after the first step), then reads
commands from stdin, one a line: `segv` (ctypes.string_at(0) inside `read_address`), `abort`
(os.abort() inside `give_up`: SIGABRT), `raise`
(ValueError from `check_step` at the next step), `thread-raise` (a worker thread raises), `exit`
(a normal exit, status 0), `exit3` (sys.exit(3)). Closing stdin is a normal exit too.
"""

import argparse
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--torch", action="store_true")
parser.add_argument("--raise-at", type=int, default=-1)
parser.add_argument("--handler")
parser.add_argument("--faulthandler", action="store_true")
parser.add_argument("--own-excepthook", action="store_true")
parser.add_argument("--wrap-excepthook", action="store_true")
parser.add_argument("--pause", type=float, default=0.002)
options = parser.parse_args()

if options.faulthandler:
    faulthandler.enable(sys.stderr)

if options.own_excepthook:

    def job_hook(kind, value, tb):  # type: ignore[no-untyped-def]
        print(f"job hook: {kind.__name__}: {value}", file=sys.stderr, flush=True)

    sys.excepthook = job_hook

if options.wrap_excepthook:
    found_hook = sys.excepthook

    def wrapping_hook(kind, value, tb):  # type: ignore[no-untyped-def]
        found_hook(kind, value, tb)

    sys.excepthook = wrapping_hook

if options.handler:

    def on_sigterm(signum, frame):  # type: ignore[no-untyped-def]
        with open(options.handler, "w") as note:
            note.write(f"job handler ran for {signum}\n")
        sys.exit(7)

    signal.signal(signal.SIGTERM, on_sigterm)

commands = []
command_came = threading.Event()


def read_commands() -> None:
    for line in sys.stdin:
        commands.append(line.strip())
        command_came.set()
    commands.append("exit")
    command_came.set()


def read_address(address):  # type: ignore[no-untyped-def]
    return ctypes.string_at(address)


def give_up():  # type: ignore[no-untyped-def]
    os.abort()


def check_step(step):  # type: ignore[no-untyped-def]
    learning_rate = 0.1 * step
    raise ValueError(f"diverged at step {step} (lr {learning_rate})")


def worker() -> None:
    payload = {"batch": 17}
    raise KeyError(f"missing key in {payload}")


def act(command: str, step: int) -> None:
    if command == "segv":
        read_address(0)
    elif command == "abort":
        give_up()
    elif command == "raise":
        check_step(step)
    elif command == "thread-raise":
        thread = threading.Thread(target=worker, name="loader-thread")
        thread.start()
        thread.join()
        print("thread died", flush=True)
    elif command == "exit":
        sys.exit(0)
    elif command == "exit3":
        sys.exit(3)


threading.Thread(target=read_commands, daemon=True).start()

if options.torch:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        optimizer.zero_grad()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        step += 1
        if step == 1:
            print("ready", flush=True)
        if step == options.raise_at:
            check_step(step)
        while commands:
            act(commands.pop(0), step)
        time.sleep(options.pause)
else:

    def ready_once_waiting() -> None:
        """`ready` from inside the state under test: the main thread waiting for a command (a
        signal sent on `ready` finds it there, not on its way in)."""
        main = threading.main_thread().ident
        while True:
            frame = sys._current_frames().get(main)  # type: ignore[arg-type]
            # Event.wait called from the loop below (not the one inside Thread.start).
            while frame is not None and not (frame.f_code.co_name == "wait" and frame.f_back is not None
                                             and frame.f_back.f_code.co_name == "<module>"):  # fmt: skip
                frame = frame.f_back
            if frame is not None:
                print("ready", flush=True)
                return
            time.sleep(0.001)

    threading.Thread(target=ready_once_waiting, name="ready", daemon=True).start()
    while True:
        command_came.wait()
        command_came.clear()
        while commands:
            act(commands.pop(0), 0)
