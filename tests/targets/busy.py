"""One thread, spinning in pure Python: it never makes a system call."""

print("ready", flush=True)
total = 0
while True:
    total += 1
