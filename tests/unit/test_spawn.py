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
