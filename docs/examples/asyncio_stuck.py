"""An asyncio service that stops answering: its two handlers, in a TaskGroup, wait for a
config that the loader never announces (its Event is never set). Prints "ready" once they wait.
Needs Python 3.11+ (TaskGroup)."""

import asyncio


async def load_config(loaded: asyncio.Event) -> None:
    await asyncio.sleep(0)  # reads the config... and forgets loaded.set()


async def handle(name: str, loaded: asyncio.Event) -> None:
    await loaded.wait()


async def serve() -> None:
    loaded = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(load_config(loaded), name="loader")
        group.create_task(handle("a", loaded), name="handler-a")
        group.create_task(handle("b", loaded), name="handler-b")
        for _ in range(3):
            await asyncio.sleep(0)
        print("ready", flush=True)


asyncio.run(serve())
