"""Running py-spy without subprocess: output, exit status, the time limit."""

from __future__ import annotations

import sys
import time

import pytest

from probing.outside import spawn


def test_what_the_program_prints_and_its_status_come_back() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    status, out, err = spawn.run([sys.executable, "-c", code], timeout=10)
    assert (status, out, err) == (3, b"out\n", b"err\n")


def test_a_program_past_its_time_is_killed_and_reaped() -> None:
    started = time.monotonic()
    with pytest.raises(spawn.TimedOut):
        spawn.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3)
    assert time.monotonic() - started < 5


def test_a_large_output_is_read_whole() -> None:
    status, out, _ = spawn.run([sys.executable, "-c", "print('x' * 1_000_000)"], timeout=10)
    assert status == 0 and len(out) == 1_000_001


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_program_printing_past_its_cap_is_killed_and_reaped(stream: str) -> None:
    """What a program read from outside prints is bounded: past the cap it is killed (it would
    print forever here), not buffered without end."""
    import os

    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    code = f"import sys\nwhile True: sys.{stream}.write('x' * 65536)"
    pid = os.posix_spawn(
        sys.executable,
        [sys.executable, "-c", code],
        os.environ,
        file_actions=[(os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, err_write, 2)],
    )
    os.close(out_write)
    os.close(err_write)
    with pytest.raises(spawn.TooMuchOutput) as raised:
        spawn.collect(
            spawn.Child(pid, out_read, err_read), 30, "writer", max_stdout=1 << 20, max_stderr=1 << 20
        )
    assert (raised.value.stream, raised.value.cap) == (stream, 1 << 20)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already
