"""Capture the seed corpus of the record fuzz tests (tests/fuzz/test_fuzz_records.py) from real jobs.

    .venv/bin/python tests/fuzz/capture_record_corpus.py

Every seed is a file a real agent wrote: jobs of tests/targets/dies.py started with PROBING=1 and
a record directory of this script's own, ended the ways a job ends. Run by hand when the record
format changes; the tests only read the corpus. Files named crash-* (inputs the fuzz tests found
and keep) are left alone.

  records/exception.probing         the record of an uncaught exception (the agent's excepthook)
  records/torch-exception.probing   the same in a job training a torch model (python.torch_trace...)
  records/on-demand.probing         `probing PID record` of a live job (locals of the innermost frames)
  fatal/segfault.fatal              the .fatal file of a job that died of SIGSEGV (faulthandler's text)
  fatal/sigterm.fatal               the .fatal file of SIGTERM with its default action (every stack)
  fatal/no-trace.fatal              the .fatal file of a job killed by SIGKILL: its header line alone

The crash-* files are those seeds changed the way a reader once failed on (issue 25: a time that
is no time, lone surrogates, tables DuckDB cannot hold, a byte-swapped table, a column left out
with locals that are not JSON, a count of 70 000 characters): kept so that they stay covered.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS))

from support import PROBING, Target  # noqa: E402

CORPUS = HERE / "corpus"


def job(directory: str, *args: str) -> Target:
    # A torch job traces its steps from the first one: python.torch_trace has rows.
    env = {"PROBING_RECORD_DIR": directory, "PROBING_TORCH_TRACE": "1"}
    return Target("dies.py", via="env", args=list(args), env=env)


def only(directory: str, pattern: str) -> str:
    found = glob.glob(os.path.join(directory, pattern))
    assert len(found) == 1, (pattern, os.listdir(directory))
    return found[0]


def keep(source: str, folder: str, name: str) -> None:
    (CORPUS / folder).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, CORPUS / folder / name)
    print(f"{folder}/{name}: {os.path.getsize(source)} bytes")


def ended(directory: str, command: str, *args: str) -> str:
    """The directory's files once a dies.py job got `command` and ended."""
    with job(directory, *args) as target:
        assert target.process.stdin is not None
        target.process.stdin.write(command.encode() + b"\n")
        target.process.stdin.flush()
        target.process.wait(60)
    return directory


_made: List[str] = []


def fresh() -> str:
    directory = tempfile.mkdtemp(prefix="probing-record-corpus-")
    os.chmod(directory, 0o700)
    _made.append(directory)
    return directory


def main(argv: List[str]) -> int:
    keep(only(ended(fresh(), "raise"), "*.probing"), "records", "exception.probing")
    keep(only(ended(fresh(), "raise", "--torch"), "*.probing"), "records", "torch-exception.probing")
    keep(only(ended(fresh(), "segv"), "*.fatal"), "fatal", "segfault.fatal")
    directory = fresh()
    with job(directory) as target:
        subprocess.run([PROBING, str(target.pid), "record"], check=True, capture_output=True, timeout=60)
        keep(only(directory, "*.probing"), "records", "on-demand.probing")
        os.kill(target.pid, signal.SIGTERM)
        target.process.wait(60)
    keep(only(directory, "*.fatal"), "fatal", "sigterm.fatal")
    directory = fresh()
    with job(directory) as target:
        os.kill(target.pid, signal.SIGKILL)
        target.process.wait(60)
    keep(only(directory, "*.fatal"), "fatal", "no-trace.fatal")
    for directory in _made:
        shutil.rmtree(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
