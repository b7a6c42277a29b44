"""What bounds the report and keeps it honest: the job's files read through the O_PATH check and
capped (a FIFO or device never opened, one file through many names read once), threads folded
and capped, record header values that are no time, standard output of names that are not UTF-8,
the output file (0600, checked before the job is probed), and a failed request said as such."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from test_report_page import full_report, parsed

import probing.engine.report.live as report_engine
from probing.cli.pictures.report import report_page
from probing.cli.pictures.report_parts import utc
from probing.cli.render import files
from probing.engine.backtrace import Stacks
from probing.engine.report import sources as report_sources
from probing.engine.report.sources import ReportSources, torch_version_of
from probing.engine.report.threads import INNER_FRAMES, OUTER_FRAMES, THREADS_SHOWN, fold_threads
from probing.errors import AgentTimeout, ExitCode, ProbingError, UsageError

# --- the job's files -----------------------------------------------------------------------------


def within(seconds: float, call: Any) -> Any:
    """call() in a thread; fails the test when it has not returned in `seconds` (a FIFO opened)."""
    result: List[Any] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "blocked: something was opened that should not have been"
    return result[0]


def test_one_file_through_many_names_is_read_once(tmp_path: Path) -> None:
    source = tmp_path / "big.py"
    source.write_text("".join(f"line_{n} = {n}\n" for n in range(20000)))
    sources = ReportSources(None, reader=None)
    for n in range(50):
        link = tmp_path / f"link{n}.py"
        link.symlink_to(source)
        assert sources.line(str(link), 1234) == "line_1233 = 1233"
    assert sources.read_bytes == source.stat().st_size


def test_a_fifo_or_a_device_named_as_source_is_not_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    (tmp_path / "tty.py").symlink_to("/dev/tty")
    sources = ReportSources(None, reader=None)
    assert within(5, lambda: sources.line(str(fifo), 1)) == ""
    assert within(5, lambda: sources.line(str(tmp_path / "tty.py"), 1)) == ""


def test_source_reads_are_capped_per_file_and_in_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_sources, "FILE_BYTES", 1000)
    monkeypatch.setattr(report_sources, "TOTAL_BYTES", 2500)
    sources = ReportSources(None, reader=None)
    (tmp_path / "huge.py").write_text("x = 1\n" * 1000)
    assert sources.line(str(tmp_path / "huge.py"), 1) == ""
    for n in range(4):
        (tmp_path / f"f{n}.py").write_text(f"a = {n}\n" + "#\n" * 400)
    shown = [sources.line(str(tmp_path / f"f{n}.py"), 1) for n in range(4)]
    assert shown == ["a = 0", "a = 1", "a = 2", ""] and sources.read_bytes <= 2500
    assert sources.left_unread == 2


@pytest.fixture
def mapped_torch(tmp_path: Path) -> Iterator[Any]:
    """A process that maps a file under .../torch/lib/, as libtorch is mapped: yields
    (pid, the package directory)."""
    package = tmp_path / "evil" / "torch"
    (package / "lib").mkdir(parents=True)
    (package / "lib" / "libtorch_fake.so").write_bytes(b"\0" * 4096)
    script = (
        "import mmap, sys\n"
        f"f = open({str(package / 'lib' / 'libtorch_fake.so')!r}, 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "print('ready', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child.pid, package
    finally:
        child.kill()
        child.wait()


def test_the_torch_version_is_read_from_the_package_the_maps_name(mapped_torch: Any) -> None:
    pid, package = mapped_torch
    (package / "version.py").write_text("__version__ = '2.13.0+cpu'\n")
    assert torch_version_of(pid) == "2.13.0+cpu"


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_version_file_that_is_not_a_small_regular_file_is_skipped(mapped_torch: Any, kind: str) -> None:
    pid, package = mapped_torch
    version = package / "version.py"
    if kind == "fifo":
        os.mkfifo(version)
    elif kind == "device":
        version.symlink_to("/dev/tty")
    else:
        version.write_text("__version__ = '6.6.6'\n" + "#" * 100_000)
    assert within(5, lambda: torch_version_of(pid)) is None


# --- threads -------------------------------------------------------------------------------------


def thread(n: int, frames: int = 3, same: bool = True) -> Dict[str, Any]:
    stack = [{"func": f"f{depth}", "file": "a.py" if same else f"t{n}.py", "lineno": depth}
             for depth in range(frames)]  # fmt: skip
    return {"name": f"worker-{n}", "thread_id": n, "native_id": n, "is_main": n == 0, "daemon": True,
            "state": "waiting on a lock", "activity": None, "where": "f0", "frames": stack}  # fmt: skip


def test_threads_with_the_same_stack_are_drawn_once() -> None:
    shown, left_out = fold_threads([thread(n) for n in range(5000)])
    assert left_out == 0 and [entry["count"] for entry in shown] == [1, 4999]  # main is never folded
    assert shown[0]["is_main"] and len(shown[1]["others"]) <= 8


def test_at_most_so_many_stacks_are_drawn_and_the_rest_counted() -> None:
    shown, left_out = fold_threads([thread(n, same=False) for n in range(1000)])
    assert len(shown) == THREADS_SHOWN and left_out == 1000 - THREADS_SHOWN
    page = report_page(full_report()._replace(threads=shown, thread_count=1000, threads_left_out=left_out))
    assert f"{left_out} more threads are not drawn" in page and "1,000 threads" in page
    assert len(page) < 1_000_000


def test_a_deep_stack_keeps_its_innermost_and_outermost_frames() -> None:
    shown, _ = fold_threads([thread(0, frames=500)])
    frames = shown[0]["frames"]
    assert len(frames) == INNER_FRAMES + OUTER_FRAMES + 1
    assert frames[INNER_FRAMES] == {"elided": 500 - INNER_FRAMES - OUTER_FRAMES}
    assert frames[0]["func"] == "f0" and frames[-1]["func"] == "f499"
    assert "460 frames left out" in report_page(full_report()._replace(threads=shown))


# --- values that are no time, names that are not UTF-8 --------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -1e300, 1e300, -1.0, None, "x"])
def test_a_header_time_that_is_no_time_shows_as_unknown(value: Any) -> None:
    assert utc(value) == "?"
    report = full_report()._replace(record={"path": "r.probing", "written_at": value, "reason": {}},
                                    generated_at=1.7e9)  # fmt: skip
    process = dict(report.process, started_at=value, uptime_s=value)
    page = report_page(report._replace(process=process))
    assert parsed(page).errors == []


def test_stdout_takes_a_name_that_is_not_utf8(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    name = b"\xff\xfe-arg".decode("utf-8", "surrogateescape")
    written = files.write_output("-", [report_page(full_report(name))])
    out = capsysbinary.readouterr().out
    assert len(out) == written and b"\\udcff\\udcfe-arg" in out and out.endswith(b"</html>\n")


# --- the output file ------------------------------------------------------------------------------


def test_the_file_is_the_owner_s_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        files.write_output(str(tmp_path / "job.html"), ["x"])
    finally:
        os.umask(old)
    assert (tmp_path / "job.html").stat().st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["job.html"]


def test_an_output_that_cannot_be_written_is_a_usage_error_before_anything_else(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="No such file or directory") as raised:
        files.check_output(str(tmp_path / "nowhere" / "job.html"))
    assert raised.value.exit_code == ExitCode.USAGE
    files.check_output(str(tmp_path / "job.html"))
    files.check_output("-")
    assert os.listdir(tmp_path) == []


# --- a failed request is said as such --------------------------------------------------------------


class FakeTarget:
    remote = False
    pid: Optional[int] = None


def gathered(monkeypatch: pytest.MonkeyPatch, tables: Any, memory: Any) -> report_engine.Report:
    rows = [{"pid": 1, "thread_id": 1, "native_id": 1, "thread_name": "MainThread", "is_main": True,
             "depth": 0, "func": "train", "file": "<x>", "lineno": 1, "frame_type": "Python"}]  # fmt: skip
    monkeypatch.setattr(report_engine, "read_stacks", lambda *args: Stacks(None, rows, {"argv": []}, []))
    monkeypatch.setattr(report_engine, "_tables", tables)
    monkeypatch.setattr(report_engine, "memory", memory)
    return report_engine.gather_live(FakeTarget(), 1.0, 0.0, 2)  # type: ignore[arg-type]


def timed_out(*args: Any) -> Any:
    raise AgentTimeout("the agent did not answer in 1 s")


def test_a_failed_memory_summary_is_not_torch_being_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    report = gathered(monkeypatch, timed_out, timed_out)
    assert "not imported" not in str(report.absent)
    assert "could not be told" in report.absent["torch"]
    assert len(report.failures) == 2 and all("did not answer" in failure for failure in report.failures)
    page = report_page(report)
    assert 'id="partial"' in page and "Part of this report could not be gathered" in page


def test_torch_seen_in_its_tables_stands_when_memory_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def tables(*args: Any) -> Any:
        return report_engine._Tables({}, [{"step": 1, "seconds": 0.1, "traced_s": 0.05}], [], [],
                                     ([], [], 0), [], {"python.torch_trace"})  # fmt: skip

    report = gathered(monkeypatch, tables, timed_out)
    assert report.has_torch and "torch" not in report.absent and report.steps
    assert report.failures == ("the memory summary failed: the agent did not answer in 1 s",)


def test_gathering_raises_when_nothing_can_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(*args: Any) -> Any:
        raise ProbingError("no process with PID 1")

    monkeypatch.setattr(report_engine, "read_stacks", gone)
    with pytest.raises(ProbingError, match="no process"):
        report_engine.gather_live(FakeTarget(), 1.0, 0.0, 2)  # type: ignore[arg-type]
