"""The short version of `make soak`: a few cycles of inject, eval, query and detach against
self-checking jobs on the oldest Python, Debian's stripped 3.11 and the torch job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A benchmark run as a test (benchmarks/soak.py), its commands under their timeouts: it runs alone.
pytestmark = pytest.mark.serial

SOAK = Path(__file__).resolve().parents[3] / "benchmarks" / "soak.py"


def test_a_short_soak_leaves_every_job_unharmed() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--cycles", "3", "--quick"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 crashed, 0 changed, 0 failed commands" in done.stdout, done.stdout
    assert "venv train" in done.stdout  # the torch job was soaked, not skipped
