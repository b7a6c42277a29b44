"""The native front end (native/front/) decoding what a job controls: an agent's replies, and a
py-spy dump of a job stuck on its GIL. Its contract is the Python CLI's, in its own terms: it
renders the stacks (exit 0) or hands the command line to the Python CLI (exit 1 here, where no
Python CLI lies beside the copy), having printed nothing; never a crash, a hang, or a read or
write out of bounds.

Two ways in:
- front_driver.c, built with AddressSanitizer and UBSan where the compiler has them, runs the
  front end's own decoding functions over many inputs in one process: a read one byte past a
  buffer fails there, where the command itself might print garbage or nothing at all;
- the installed `probing` command against a fake agent on the socket where it looks, for a few
  inputs: the sockets, the deadlines and the hand-over, as a user meets them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Iterator, List, NamedTuple, Optional, Tuple

import pytest
from agents import FakeAgent
from harness import (
    BYTES,
    SCRATCH_BYTES,
    Broken,
    child_memory_problem,
    frames,
    fuzzes,
    json_texts,
    json_values,
)

from support import BIN, Target

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FRONT = ROOT / "native" / "front"
# Every decoder of the command, none of its main() (the driver has its own).
SOURCES = [
    "agent.c",
    "gil.c",
    "json.c",
    "outside.c",
    "proc.c",
    "render.c",
    "sources.c",
    "states.c",
    "table.c",
    "utf8.c",
]
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
SANITIZER_OPTIONS = {
    # The front end is a short-lived program that frees little: leaks are not the point here.
    "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=16",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
# The driver runs this many inputs, then a fresh one starts: what it does not free adds up.
INPUTS_PER_DRIVER = 300
DECODE_TIMEOUT_S = 10.0


def build_driver(folder: Path) -> Tuple[Path, bool]:
    """The driver, and whether it runs under the sanitizers (a compiler without them builds it
    plain: it still catches crashes and hangs)."""
    header = folder / "front_tables.h"
    tables = [sys.executable, str(FRONT / "gen_tables.py"), str(ROOT), str(header)]
    subprocess.run(tables, check=True, timeout=120)
    driver = folder / "front_driver"
    sources = [str(HERE / "front_driver.c"), *(str(FRONT / name) for name in SOURCES)]
    base = ["cc", "-O1", "-g", "-I", str(folder), "-I", str(FRONT), "-o", str(driver), *sources]
    built = subprocess.run([*base[:1], *SANITIZERS, *base[1:]], capture_output=True, text=True, timeout=300)
    if built.returncode == 0:
        return driver, True
    subprocess.run(base, check=True, capture_output=True, timeout=300)
    return driver, False


class Driver:
    """The driver process, restarted after a crash and every INPUTS_PER_DRIVER inputs."""

    def __init__(self, binary: Path, sanitized: bool, python_pid: int) -> None:
        self.binary = binary
        self.sanitized = sanitized
        self.python_pid = python_pid
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.stderr: Optional[IO[bytes]] = None
        self.count = 0

    def _start(self) -> subprocess.Popen[bytes]:
        self.stop()
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [str(self.binary), str(self.python_pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=dict(os.environ, **SANITIZER_OPTIONS),
        )
        self.count = 0
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            for stream in (self.process.stdin, self.process.stdout, self.stderr):
                if stream is not None:
                    stream.close()
        self.process = None

    def _died(self, process: subprocess.Popen[bytes], what: str) -> Broken:
        process.kill()
        status = process.wait(10)
        assert self.stderr is not None
        self.stderr.seek(0)
        said = self.stderr.read().decode("utf-8", "replace")[-6000:]
        self.process = None
        return Broken(f"the front end's decoder {what} (status {status}):\n{said}")

    def decode(self, kind: bytes, data: bytes) -> str:
        """ "ok N" or "fallback"; Broken if the driver crashed, hung, or grew past the limit."""
        process = self.process
        if process is None or self.count >= INPUTS_PER_DRIVER:
            process = self._start()
        assert process.stdin is not None and process.stdout is not None
        self.count += 1
        with open(f"/proc/{process.pid}/clear_refs", "w") as clear:
            clear.write("5")  # the driver's high-water mark of resident memory, reset to now
        start = resident(process.pid, "VmRSS")
        try:
            process.stdin.write(kind + struct.pack(">I", len(data)) + data)
            process.stdin.flush()
        except BrokenPipeError:
            raise self._died(process, "died") from None
        ready, _, _ = select.select([process.stdout], [], [], DECODE_TIMEOUT_S)
        if not ready:
            raise self._died(process, f"did not answer in {DECODE_TIMEOUT_S:g} s")
        line = process.stdout.readline().decode()
        if not line:
            raise self._died(process, "died")
        grown = resident(process.pid, "VmHWM") - start
        if grown > 500 << 20:
            raise Broken(f"the front end's decoder grew by {grown >> 20} MiB")
        return line.strip()


def resident(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} for PID {pid}")


@pytest.fixture(scope="module")
def built_driver(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, bool]:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the front end's decoders with")
    return build_driver(tmp_path_factory.mktemp("front-driver"))


class StuckJob(NamedTuple):
    pid: int
    holder: int  # the native id of its thread that holds the GIL


@pytest.fixture(scope="module")
def stuck_job() -> Iterator[StuckJob]:
    """A job whose thread holds the GIL asleep in C: the front end renders a py-spy dump only
    for such a job, once /proc shows the thread it names keeps the GIL (outside/gil.py)."""
    job = Target("gil_holder.py", via="plain")
    try:
        tasks = [int(task) for task in os.listdir(f"/proc/{job.pid}/task") if int(task) != job.pid]
        assert len(tasks) == 1, tasks
        yield StuckJob(job.pid, tasks[0])
    finally:
        job.kill()
        job.finish(10)  # reaped, its output read to the end: its pipes can close
        for stream in (job.process.stdout, job.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def driver(built_driver: Tuple[Path, bool], stuck_job: StuckJob) -> Iterator[Driver]:
    running = Driver(*built_driver, python_pid=stuck_job.pid)
    try:
        yield running
    finally:
        running.stop()


def held_by(job: StuckJob, data: bytes) -> bytes:
    """A dump whose thread that owns the GIL (the first that does, else the first) is the stuck
    job's holder: what py-spy prints of that job (the captured dumps name threads of processes
    long gone, most of them not stuck). Bytes that are no JSON list of threads stay as they are."""
    try:
        threads = json.loads(data)
    except (ValueError, RecursionError):
        return data
    listed = [thread for thread in threads if isinstance(thread, dict)] if isinstance(threads, list) else []
    if not listed:
        return data
    holder = next((thread for thread in listed if thread.get("owns_gil") is True), listed[0])
    holder.update(os_thread_id=job.holder, owns_gil=True)
    return json.dumps(threads).encode()


REPLIES = BYTES + (frames(),) * 6


@fuzzes("replies", examples=500, mutations=REPLIES, pattern=("backtrace-*", "crash-*"))
def test_agent_replies_as_the_front_end_reads_them(driver: Driver, data: bytes) -> str:
    """An input is what an agent sent on its socket: the hello's reply, then the backtrace's."""
    return driver.decode(b"r", data)


@fuzzes("pyspy", examples=300, mutations=BYTES + (json_values(),) * 6, scratch=SCRATCH_BYTES | json_texts(),
        pattern="*.json")  # fmt: skip
def test_pyspy_dumps_as_the_front_end_reads_them(driver: Driver, stuck_job: StuckJob, data: bytes) -> str:
    """An input is what py-spy printed for a job stuck on its GIL, which the front end renders."""
    return driver.decode(b"o", held_by(stuck_job, data))


# --- the installed command ---------------------------------------------------------------------


@contextlib.contextmanager
def running() -> Iterator[None]:
    """A thread of this process (the fake agent's "job") runs while the front end asks: a job all
    of whose threads sleep reads as stuck on its GIL, and the front end would look from outside
    instead (tests/integration/test_front_replies.py `running`)."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        yield
    finally:
        stop.set()
        spinner.join()


@pytest.fixture(scope="module")
def front_alone(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The installed command, copied where no Python CLI lies beside it: a hand-over fails at
    once (exit 1, saying so) instead of running the Python CLI."""
    copy = tmp_path_factory.mktemp("front-alone") / "probing"
    shutil.copy(BIN / "probing", copy)
    return str(copy)


def front_end(front: str, arguments: List[str]) -> Tuple[int, bytes, bytes, object]:
    """(exit status, stdout, stderr, resource usage) of the command, killed past the time limit."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen([front, *arguments], stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        watchdog = threading.Timer(DECODE_TIMEOUT_S, process.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            watchdog.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return process.returncode, out.read(), err.read(), usage


@fuzzes("replies", examples=25, mutations=REPLIES, pattern=("backtrace-*", "crash-*"))
def test_agent_replies_as_the_installed_front_end_reads_them(
    fake_agent: FakeAgent, front_alone: str, data: bytes
) -> bytes:
    fake_agent.reply = data
    with running():
        status, out, err, usage = front_end(front_alone, [str(os.getpid()), "backtrace"])
    handed_over = status == 1 and b"cannot run the Python CLI" in err and not out
    if status != 0 and not handed_over:
        raise Broken(f"the front end exited with status {status}: {err[-3000:].decode('utf-8', 'replace')}")
    problem = child_memory_problem(usage)
    if problem is not None:
        raise Broken(problem)
    return out


def test_a_dump_of_many_threads_takes_linear_time(driver: Driver, stuck_job: StuckJob) -> None:
    """py-spy's dump of a job of 20 000 threads stuck on its GIL: the front end's check that no two
    threads share an id compared every pair (10 000 threads took 8.9 s, 40 000 over two minutes);
    now it sorts."""
    frame = {"name": "f", "filename": "/nonexistent/job.py", "module": None, "line": 1}
    threads = [
        {"pid": stuck_job.pid, "thread_id": index + 1, "thread_name": f"t{index}",
         "os_thread_id": stuck_job.holder if index == 0 else 10**6 + index, "active": False,
         "owns_gil": index == 0, "frames": [frame]}
        for index in range(20_000)
    ]  # fmt: skip
    started = time.monotonic()
    assert driver.decode(b"o", json.dumps(threads).encode()).startswith("ok ")
    assert time.monotonic() - started < 5
