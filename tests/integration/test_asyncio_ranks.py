"""asyncio tasks where the single-process path is not the one taken: every rank of a torchrun
job (`backtrace --ranks all`: each loop's tasks under its thread, ranks folded only when their
tasks are the same), and a job read from outside (its agent cannot answer: the tasks are said
to be unread, not left out silently)."""

from __future__ import annotations

import re

from support import Target, TorchrunJob, probing

UNREAD = "  asyncio tasks of its event loop: unread from outside (only its agent reads them)\n"


def test_every_ranks_loop_shows_its_tasks_and_ranks_fold_only_with_the_same_tasks() -> None:
    with TorchrunJob("asyncio", ranks=2, args=["--rank-at", "1"]) as job:
        result = probing(str(job.pids[0]), "backtrace", "--ranks", "all", timeout=60)
        assert result.returncode == 0, result.stderr
        blocks = re.split(r"\n── ", result.stdout)
        loops = [block for block in blocks if "asyncio tasks of its event loop" in block]
        assert len(loops) == 2, result.stdout  # the two ranks' tasks differ: not folded
        by_rank = {block.split(" (PID", 1)[0]: block for block in loops}
        assert set(by_rank) == {"rank 0", "rank 1"}, list(by_rank)
        assert "asyncio tasks of its event loop: 3\n" in by_rank["rank 0"]  # serve() and its two
        assert "asyncio tasks of its event loop: 4\n" in by_rank["rank 1"]
        assert 'Task "stuck-fetch"' in by_rank["rank 1"] and "stuck-fetch" not in by_rank["rank 0"]
        for block in loops:
            assert 'Task "fetch-0"' in block and 'Task "fetch-1"' in block


def test_a_loop_read_from_outside_says_its_tasks_are_unread() -> None:
    """The native front end (first command: it attaches, finds the GIL held, and hands the
    answer to the Python CLI for the loop) and the Python CLI print the same."""
    with Target("asyncio_gil_held.py", via="plain") as job:
        native = probing(str(job.pid), "backtrace")
        python = probing(str(job.pid), "backtrace", env={"PROBING_NATIVE_FRONT": "0"})
        for result in (native, python):
            assert result.returncode == 0, result.stderr
            assert "holds the GIL" in result.stderr and "answered from outside" in result.stderr
            main = result.stdout.split("\nThread ")[1]  # the main thread's block runs the loop
            assert "run_forever" in main and UNREAD in main, main
        assert native.stdout == python.stdout
        assert job.alive()
