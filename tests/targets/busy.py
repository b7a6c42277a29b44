"""One thread, spinning in pure Python: it never makes a system call (but the one write that
announces it, made from inside the loop once it spins)."""

total = 0
while True:
    total += 1
    if total == 1000:
        print("ready", flush=True)
