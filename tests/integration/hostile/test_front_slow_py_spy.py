"""The native front end's py-spy for a job stuck on its GIL, slower than the time the front end
gives it (as a loaded machine makes it): handed over still running to the Python CLI, which
waits on within its own share of --timeout, rather than killed and started again."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Dict

import pytest

from support import BIN, Target, wait_until

# Past what the front end gives a look from outside (--timeout's 3 s, less what it waited for
# the agent), within what the front end and the Python CLI give it together.
PY_SPY_DELAY_S = 4


@pytest.fixture
def slow_py_spy(tmp_path: Path) -> Dict[str, Path]:
    """The front end and the Python CLI in a folder of their own, with a py-spy beside them that
    logs its start, sleeps PY_SPY_DELAY_S, logs that it slept (not when it was killed first),
    then runs the real one."""
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(BIN / "probing", folder / "probing")
    shutil.copy(BIN / "probing-python", folder / "probing-python")
    log = tmp_path / "py-spy.log"
    fake = folder / "py-spy"
    fake.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\nsleep {PY_SPY_DELAY_S}\necho slept >> {log}\n'
        f'exec {BIN / "py-spy"} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {"probing": folder / "probing", "log": log}


def test_a_slow_py_spy_is_handed_over_running_and_its_dump_is_the_answer(
    slow_py_spy: Dict[str, Path],
) -> None:
    with Target("gil_holder.py") as target:
        socket = Path(os.environ["PROBING_SOCKET_DIR"]) / f"{target.pid}.sock"
        assert wait_until(socket.exists)
        environment = {key: value for key, value in os.environ.items() if key != "PROBING"}
        result = subprocess.run(
            [str(slow_py_spy["probing"]), str(target.pid), "backtrace"],
            capture_output=True,
            text=True,
            timeout=60,
            env=environment,
        )
    assert result.returncode == 0, result.stderr
    assert "holds the GIL" in result.stderr and "answered from outside the process (py-spy)" in result.stderr
    assert "Thread" in result.stdout and "gil-holder" in result.stdout
    # Started once, by the front end, and run to its end: not killed at the front end's deadline.
    assert slow_py_spy["log"].read_text() == f"dump --pid {target.pid} --json\nslept\n"
