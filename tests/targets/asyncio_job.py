"""An asyncio job whose tasks all wait for good: a task stuck on an Event ("stuck-on-event"),
nested tasks (a gather of a gather), a TaskGroup (3.11+) and, with `--many N`, N more tasks each
waiting on the Event. With `--ticker`, one more task wakes up every 50 ms: the job progresses.
Prints "ready" once every task has reached its wait."""

import asyncio
import sys


async def stuck_on_event(event):
    await event.wait()


async def leaf(event):
    await event.wait()


async def middle(event):
    await asyncio.gather(leaf(event), leaf(event))


async def group_member(event):
    await event.wait()


async def with_group(event):
    async with asyncio.TaskGroup() as group:
        group.create_task(group_member(event), name="group-member-1")
        group.create_task(group_member(event), name="group-member-2")


async def sleeper(event):
    await event.wait()


async def ticker():
    while True:
        await asyncio.sleep(0.05)


async def main():
    event = asyncio.Event()  # never set
    many = int(sys.argv[sys.argv.index("--many") + 1]) if "--many" in sys.argv else 0
    stuck = asyncio.ensure_future(stuck_on_event(event))
    stuck.set_name("stuck-on-event")
    tasks = [stuck, asyncio.ensure_future(middle(event))]
    if hasattr(asyncio, "TaskGroup"):
        tasks.append(asyncio.ensure_future(with_group(event)))
    if "--ticker" in sys.argv:
        tasks.append(asyncio.ensure_future(ticker()))
    tasks += [asyncio.ensure_future(sleeper(event)) for _ in range(many)]
    for _ in range(5):  # every task reaches its wait: the gather's and the group's children too
        await asyncio.sleep(0)
    print("ready", flush=True)
    await asyncio.gather(*tasks)


asyncio.run(main())
