"""A job that checks its own results every step, for the soak and the hostile tests.

Each step recomputes floating-point work (scalar and, with torch, vectorised) and a heap
structure whose expected results were computed before anything could attach, and compares
them bit for bit: an injector that clobbered a register or the allocator, or an agent that
touched the job's tensors, shows up as MISMATCH on stderr and exit code 3. It also counts the
threads `threading` knows, as jobs that wait for their workers do: one that is not the job's
(an agent thread, a _DummyThread made for one) is a MISMATCH too.

    --print     the main thread prints "line N" every step (to stdout, a pipe or a file)
    --gc-thread a thread calls gc.collect() in a loop
    --torch     also train a small MLP with an optimizer every step
    --spin      a thread spins in pure Python

Prints "ready" once the first step has been checked. When stdin closes it prints
"steps N ok" and exits 0.
"""

import argparse
import gc
import math
import sys
import time

parser = argparse.ArgumentParser()
for flag in ("--print", "--gc-thread", "--torch", "--spin"):
    parser.add_argument(flag, action="store_true")
options = parser.parse_args()

stop = []


def scalar_work():
    total = 0.0
    for index in range(1, 400):
        total += math.sin(index * 0.37) * math.sqrt(index) / (1.0 + index % 7)
    return total.hex()


def heap_work():
    table = {f"key{index}": [index * 3, str(index) * 2, (index, -index)] for index in range(300)}
    return sum(len(value[1]) + value[0] + value[2][1] for value in table.values())


expected_scalar, expected_heap = scalar_work(), heap_work()

torch_check = None
if options.torch:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, labels = torch.randn(64, 64), torch.randint(0, 10, (64,))
    probe_a, probe_b = torch.randn(48, 48), torch.randn(48, 48)
    expected_tensor = (probe_a @ probe_b).sum().item().hex()

    def torch_check():
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if not math.isfinite(loss.item()):
            return f"loss {loss.item()}"
        got = (probe_a @ probe_b).sum().item().hex()
        return None if got == expected_tensor else f"matmul {got} != {expected_tensor}"


def start_thread(target, name):
    # Imported here, not at the top: without --gc-thread/--spin the job runs without threading
    # until probing's stdin watcher needs it (the attach must not bring it in either).
    import threading

    threading.Thread(target=target, name=name, daemon=True).start()


def collect_forever():
    while not stop:
        gc.collect()


def spin_forever():
    count = 0
    while not stop:
        count += 1


if options.gc_thread:
    start_thread(collect_forever, "collector")
if options.spin:
    start_thread(spin_forever, "spinner")

step = 0
OWN_THREADS = {"MainThread", "collector", "spinner"}


def threads_of_others():
    threading = sys.modules.get("threading")  # only if the job (or an attach) imported it
    if threading is None:
        return None
    others = sorted(thread.name for thread in threading.enumerate() if thread.name not in OWN_THREADS)
    return f"threading counts {others}" if others else None


def check():
    problems = []
    others = threads_of_others()
    if others:
        problems.append(others)
    if scalar_work() != expected_scalar:
        problems.append("scalar")
    if heap_work() != expected_heap:
        problems.append("heap")
    if torch_check is not None:
        trouble = torch_check()
        if trouble:
            problems.append(trouble)
    return problems


def main():
    global step
    import select

    while True:
        problems = check()
        if problems:
            sys.stderr.write(f"MISMATCH at step {step}: {', '.join(problems)}\n")
            sys.stderr.flush()
            stop.append(True)
            sys.exit(3)
        if options.print:
            print("line", step, flush=True)
        if step == 0:
            print("ready", flush=True)
        step += 1
        # stdin closing is the signal to stop: a zero-timeout poll, no thread needed.
        readable, _, _ = select.select([sys.stdin], [], [], 0.002)
        if readable and not sys.stdin.readline():
            break
    stop.append(True)
    time.sleep(0.01)
    print(f"steps {step} ok", flush=True)


main()
