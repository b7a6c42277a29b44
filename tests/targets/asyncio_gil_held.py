"""An asyncio job (three tasks waiting on an Event) with a thread that then holds the GIL inside
a C call (libc sleep, the switch interval stretched first): its agent cannot answer, so its
stacks are read from outside, where a loop's tasks cannot be. Prints "ready" from the holder
(write(2), which keeps the GIL)."""

import asyncio
import ctypes
import sys
import threading


def hold_the_gil() -> None:
    sys.setswitchinterval(1000.0)
    libc = ctypes.PyDLL(None)
    libc.write(1, b"ready\n", 6)
    libc.sleep(3600)


async def waiter(event: asyncio.Event) -> None:
    await event.wait()


async def main() -> None:
    event = asyncio.Event()
    tasks = [asyncio.create_task(waiter(event), name=f"waiter-{index}") for index in range(3)]
    await asyncio.sleep(0.1)  # every task at its wait
    threading.Thread(target=hold_the_gil, name="gil-holder", daemon=True).start()
    await asyncio.gather(*tasks)


asyncio.run(main())
