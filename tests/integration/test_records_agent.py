"""Records written by the agent when a real job ends (issue 15): read back with the protocol's
reader, never through the CLI side (test_records_cli.py covers `probing FILE ...`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from probing.protocol.records import RecordFile, read_record
from probing.protocol.tables import decode_table

from support import PROBING, TARGETS, VENV_PYTHON, Target, interpreter_params, probing, wait_until


def record_env(directory: Path, **more: str) -> Dict[str, str]:
    return dict({"PROBING_RECORD_DIR": str(directory)}, **more)


def records_in(directory: Path) -> List[Path]:
    return sorted(directory.glob("*.probing")) if directory.is_dir() else []


def only_record(directory: Path) -> RecordFile:
    found = records_in(directory)
    assert len(found) == 1, found
    return read_record(str(found[0]))


def table(record: RecordFile, name: str) -> List[Dict[str, Any]]:
    for descriptor, payload in record.tables:
        if descriptor["name"] == name:
            return decode_table(descriptor, payload).to_rows()
    raise AssertionError(f"no {name} in {record.header['tables']}")


def send(job: Target, line: str) -> None:
    job.process.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
    job.process.stdin.flush()  # type: ignore[union-attr]


def main_stack(record: RecordFile) -> List[Dict[str, Any]]:
    rows = [row for row in table(record, "python.backtrace") if row["is_main"]]
    return sorted(rows, key=lambda row: row["depth"])


def test_a_torch_job_raising_at_a_step_leaves_a_record_of_that_moment(tmp_path: Path) -> None:
    # Every step traced: the default samples this tiny model's steps (its hooks cost more than 1%).
    env = record_env(tmp_path / "records", PROBING_TORCH_TRACE="every=1")
    with Target("dies.py", via="env", args=["--torch", "--raise-at", "40"], env=env) as job:
        assert job.process.wait(60) == 1
        assert "ValueError: diverged at step 40" in job.output()  # Python's own report, as ever
    record = only_record(tmp_path / "records")
    header = record.header
    assert header["reason"] == {
        "kind": "exception", "message": "ValueError: diverged at step 40 (lr 4.0)", "signal": None,
        "exit_status": 1,
    }  # fmt: skip
    assert header["exception"]["type"] == "builtins.ValueError"
    assert header["exception"]["frames"][-1]["func"] == "check_step"
    assert "Traceback (most recent call last)" in header["exception"]["text"]
    assert header["pid"] == job.pid and header["argv"][0].endswith("dies.py")
    stack = main_stack(record)
    assert stack[0]["func"] == "check_step" and stack[0]["file"].endswith("dies.py")
    assert json.loads(stack[0]["locals"])["learning_rate"] == "4.0"
    assert [row["func"] for row in stack] == ["check_step", "<module>"]
    steps = sorted({row["step"] for row in table(record, "python.torch_trace")})
    assert steps[-1] >= 39  # the last steps before the end
    assert os.stat(record.path).st_mode & 0o777 == 0o600
    assert not list((tmp_path / "records").glob("*.fatal"))  # an exit without a fault: gone


def test_sigterm_is_recorded_and_the_jobs_own_handler_still_decides_the_exit(tmp_path: Path) -> None:
    note = tmp_path / "handler-ran"
    env = record_env(tmp_path / "records")
    with Target("dies.py", via="env", args=["--handler", str(note)], env=env) as job:
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(30) == 7  # the job's handler: sys.exit(7)
    assert note.read_text() == "job handler ran for 15\n"
    record = only_record(tmp_path / "records")
    assert record.header["reason"]["kind"] == "signal" and record.header["reason"]["signal"] == 15
    # Where the job was (waiting for a command), not our handler.
    assert [row["func"] for row in main_stack(record)][-2:] == ["wait", "<module>"]
    assert not any("probing/agent" in row["file"] for row in main_stack(record))


def test_sigterm_with_the_default_action_still_kills_the_job_by_sigterm(tmp_path: Path) -> None:
    with Target("dies.py", via="env", env=record_env(tmp_path / "records")) as job:
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(30) == -signal.SIGTERM
    assert records_in(tmp_path / "records") == []  # faulthandler's dump is the record of it
    (fatal,) = (tmp_path / "records").glob("*.fatal")
    assert 'dies.py", line' in fatal.read_text() and "Fatal Python error" not in fatal.read_text()


def test_a_segfault_leaves_the_python_frame_that_called_into_c(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    with Target("dies.py", via="env", env=record_env(directory)) as job:
        fatal = directory / f"dies-{job.pid}.fatal"
        assert fatal.read_text().startswith("#probing-fatal 1 {")
        send(job, "segv")
        assert job.process.wait(30) == -signal.SIGSEGV
    first, rest = fatal.read_text().split("\n", 1)
    header = json.loads(first[len("#probing-fatal 1 ") :])
    assert header["reason"]["kind"] == "fatal_signal" and header["pid"] == job.pid
    assert "Fatal Python error: Segmentation fault" in rest
    assert "Current thread" in rest and "in read_address" in rest and "in act" in rest


def test_a_job_with_its_own_faulthandler_keeps_it(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    env = record_env(directory, PYTHONFAULTHANDLER="1")
    with Target("dies.py", via="env", env=env) as job:
        send(job, "segv")
        assert job.process.wait(30) == -signal.SIGSEGV
        # The job's own dump, on its stderr (read by the Target's reader thread: it may lag the exit).
        assert wait_until(lambda: "in read_address" in job.output(), timeout=10), job.output()
    assert not list(directory.glob("*.fatal"))


def test_a_job_that_enables_faulthandler_later_takes_it_over(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    with Target("dies.py", via="env", args=["--faulthandler"], env=record_env(directory)) as job:
        send(job, "segv")
        assert job.process.wait(30) == -signal.SIGSEGV
        assert wait_until(lambda: "in read_address" in job.output(), timeout=10), job.output()
    # Left with its header alone: the reader says the job ended without a trace.
    (fatal,) = directory.glob("*.fatal")
    assert fatal.read_text().count("\n") == 1


def test_a_thread_that_dies_is_recorded_and_the_job_goes_on(tmp_path: Path) -> None:
    with Target("dies.py", via="env", env=record_env(tmp_path / "records")) as job:
        send(job, "thread-raise")
        assert wait_until(lambda: "thread died" in job.stdout_lines, 30), job.output()
        assert job.alive()
        record = only_record(tmp_path / "records")
        assert "KeyError" in job.output()  # threading's own report still printed
    assert record.header["exception"]["thread"] == "loader-thread"
    assert record.header["reason"]["exit_status"] is None  # the process went on
    worker = [row for row in table(record, "python.backtrace") if row["thread_name"] == "loader-thread"]
    assert min(worker, key=lambda row: row["depth"])["func"] == "worker"


def test_a_job_that_never_dies_leaves_no_record(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    with Target("dies.py", via="env", env=record_env(directory)) as job:
        assert list(directory.glob("*.fatal"))
        assert job.finish() == 0
    assert os.listdir(directory) == []


def test_an_unusable_record_directory_leaves_the_job_exactly_as_it_was(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    for directory in (loose, tmp_path / "a-file" / "records"):
        (tmp_path / "a-file").write_text("")
        args = ["--torch", "--raise-at", "3"]
        with Target("dies.py", via="env", args=args, env=record_env(directory)) as job:
            assert job.process.wait(60) == 1
            assert "ValueError: diverged at step 3" in job.output()
        assert records_in(directory) == []


def ask_for_record(pid: int, kind: str = "on_demand") -> Dict[str, Any]:
    from probing.engine.target import Target as Inspect

    with Inspect(str(pid), no_attach=True).connect(10.0) as client:
        result, _ = client.call("record", {"kind": kind, "reason": "from the test"}, timeout=30.0)
    assert isinstance(result, dict)
    return result


def test_a_record_on_demand_leaves_the_job_running_and_keeps_the_newest(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    env = record_env(directory, PROBING_RECORD_KEEP="2", PROBING_TORCH_TRACE="1")
    with Target("dies.py", via="env", args=["--torch"], env=env) as job:
        results = [ask_for_record(job.pid) for _ in range(3)]
        assert job.alive()
        kept = records_in(directory)
        assert [str(path) for path in kept] == sorted(result["path"] for result in results[1:])
        record = read_record(results[-1]["path"])
        assert record.header["reason"]["kind"] == "on_demand"
        assert record.header["reason"]["message"] == "from the test"
        assert "python.torch_trace" in results[-1]["tables"] and results[-1]["failures"] == []
        # Built by the agent's thread: the tables that read tensor data are left out, said so.
        assert "python.modules" not in results[-1]["tables"]
        assert any("python.modules" in note for note in results[-1]["notes"])
        assert job.finish() == 0


def test_nan_stop_records_the_module_even_when_the_job_catches_it(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    args = ["--poison", "forward", "--gate"]
    with Target("torch_job.py", via="plain", args=args, env=record_env(directory)) as job:
        assert probing(str(job.pid), "nan", "on", "--stop").returncode == 0
        send(job, "go")
        assert wait_until(lambda: any(line.startswith("stopped") for line in job.stdout_lines), 60, 0.1)
        record = only_record(directory)
        assert job.alive()
    reason = record.header["reason"]
    assert reason["kind"] == "nan" and "of model.2 (Middle) at step 29" in reason["message"]
    assert record.header["exception"]["type"].endswith("NonFiniteError")
    events = table(record, "python.nan_events")
    assert [(row["step"], row["module"]) for row in events] == [(29, "model.2")]


def test_the_hang_watchdog_asks_for_a_record_before_ending_the_job(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    report = tmp_path / "report.json"
    command = [PROBING, "run", "--hang-timeout", "2", "--report", str(report), "--", VENV_PYTHON]
    environment = dict(os.environ, **record_env(directory))
    environment.pop("PROBING", None)
    result = subprocess.run(
        [*command, str(TARGETS / "deadlock.py")], capture_output=True, text=True, timeout=120, env=environment
    )
    assert result.returncode == 11, result.stderr
    record = only_record(directory)  # the SIGTERM that ended it wrote none of its own
    assert f"record written to {record.path}" in result.stderr
    assert json.loads(report.read_text())["records"][0]["path"] == record.path
    assert record.header["reason"]["kind"] == "watchdog"
    innermost = {row["thread_name"]: row for row in table(record, "python.backtrace") if row["depth"] == 0}
    assert innermost["takes-first"]["func"] == "take" and innermost["takes-second"]["func"] == "take"


def test_detach_gives_the_job_back_its_own_hooks_exactly(tmp_path: Path) -> None:
    script = """
import faulthandler, signal, sys, threading
def job_hook(*args): pass
sys.excepthook = job_hook
before = (sys.excepthook, threading.excepthook, signal.getsignal(signal.SIGTERM),
          signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP), signal.signal, signal.getsignal)
from probing.agent import records
live = records.install(None)
assert sys.excepthook is not job_hook and faulthandler.is_enabled()
def later(signum, frame): pass
assert signal.signal(signal.SIGTERM, later) == signal.SIG_DFL
assert signal.getsignal(signal.SIGTERM) is later
assert signal.signal(signal.SIGTERM, signal.SIG_DFL) is later
records.uninstall()
after = (sys.excepthook, threading.excepthook, signal.getsignal(signal.SIGTERM),
         signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP), signal.signal, signal.getsignal)
assert before == after, (before, after)
assert not faulthandler.is_enabled()
print("same")
"""
    environment = dict(os.environ, **record_env(tmp_path / "records"))
    result = subprocess.run([VENV_PYTHON, "-c", script], capture_output=True, text=True, env=environment)
    assert result.stdout == "same\n", result.stderr
    assert os.listdir(tmp_path / "records") == []


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("setting", ["1", "0"])
def test_records_cost_an_idle_job_nothing(tmp_path: Path, setting: str) -> None:
    env = record_env(tmp_path / "records", PROBING_RECORD=setting)
    with Target("dies.py", via="env", env=env) as job:
        start = cpu_seconds(job.pid)
        time.sleep(2.0)  # measuring idle cost over a window; nothing to wait for
        used = cpu_seconds(job.pid) - start
        assert used <= 0.05, used
        assert (setting == "1") == bool(list((tmp_path / "records").glob("*.fatal")))
        assert job.finish() == 0


def test_exit_with_a_status_is_not_a_record(tmp_path: Path) -> None:
    # sys.exit(3) reaching the top is not seen from inside (docs/records.md says why).
    with Target("dies.py", via="env", env=record_env(tmp_path / "records")) as job:
        send(job, "exit3")
        assert job.process.wait(30) == 3
    assert os.listdir(tmp_path / "records") == []  # no record, and the .fatal file went at exit


def test_a_collective_timeout_is_recorded_as_one(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from support import free_port

    port = free_port("127.0.0.1")
    env = dict(os.environ, PROBING="1", **record_env(tmp_path / "records"))
    ranks = [
        subprocess.Popen(
            [VENV_PYTHON, str(TARGETS / "gloo_timeout.py"), str(rank), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    try:
        _, errors = ranks[0].communicate(timeout=90)
        assert ranks[0].returncode == 1, errors
    finally:
        for process in ranks:
            process.kill()
            process.wait(30)
    (path,) = records_in(tmp_path / "records")
    record = read_record(str(path))
    reason = record.header["reason"]
    assert reason["kind"] == "collective_timeout" and "Timed out" in reason["message"], reason
    assert record.header["pid"] == ranks[0].pid
    assert "reduce_gradients" in [row["func"] for row in main_stack(record)]
    assert "python.process_groups" in record.header["tables"]


@pytest.mark.parametrize("python", interpreter_params())
def test_records_on_every_interpreter(tmp_path: Path, python: str) -> None:
    directory = tmp_path / "records"
    note = tmp_path / "handler-ran"
    with Target("dies.py", python=python, args=["--handler", str(note)], env=record_env(directory)) as job:
        send(job, "thread-raise")
        assert wait_until(lambda: "thread died" in job.stdout_lines, 30), job.output()
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(30) == 7  # probing run passes the job's own status on
    assert note.exists()
    kinds = sorted(read_record(str(path)).header["reason"]["kind"] for path in records_in(directory))
    assert kinds == ["exception", "signal"]
    assert not list(directory.glob("*.fatal"))


@pytest.mark.parametrize("hook", [[], ["--wrap-excepthook"]], ids=["our-hook", "job-wraps-our-hook"])
def test_sigint_makes_one_record_and_the_job_still_dies_of_keyboardinterrupt(
    tmp_path: Path, hook: List[str]
) -> None:
    """Also when the job wraps sys.excepthook and calls ours from its own (review D, 2)."""
    with Target("dies.py", via="env", args=hook, env=record_env(tmp_path / "records")) as job:
        os.kill(job.pid, signal.SIGINT)
        assert job.process.wait(30) == -signal.SIGINT  # Python ends an uncaught Ctrl-C by SIGINT
        assert "KeyboardInterrupt" in job.output()
    # No handler of ours: the KeyboardInterrupt that ends the job is the record.
    assert only_record(tmp_path / "records").header["exception"]["type"] == "builtins.KeyboardInterrupt"


def test_a_record_over_its_size_bound_keeps_the_newest_rows_and_says_so(tmp_path: Path) -> None:
    env = record_env(tmp_path / "records", PROBING_TORCH_TRACE="every=1", PROBING_RECORD_MAX_MB="0.02")
    with Target("dies.py", via="env", args=["--torch", "--raise-at", "300"], env=env) as job:
        assert job.process.wait(120) == 1
    record = only_record(tmp_path / "records")
    assert sum(len(payload) for _, payload in record.tables) <= 0.02 * (1 << 20) + 4096 * len(record.tables)
    notes = " ".join(record.header["notes"])
    assert "python.torch_trace: cut to its newest" in notes, notes
    assert table(record, "python.torch_trace")[-1]["step"] >= 298
    assert "python.backtrace" in record.header["tables"]


def test_a_job_that_replaced_the_excepthook_is_recorded_at_exit(tmp_path: Path) -> None:
    with Target("dies.py", via="env", args=["--own-excepthook"], env=record_env(tmp_path / "records")) as job:
        send(job, "raise")
        assert job.process.wait(30) == 1
        assert "job hook: ValueError: diverged at step 0" in job.output()
        assert "Traceback" not in job.output()  # only the job's hook spoke
    record = only_record(tmp_path / "records")
    assert record.header["exception"]["frames"][-1]["func"] == "check_step"
    assert any("recorded at exit" in note for note in record.header["notes"])


def test_a_refused_directory_is_named_by_the_record_method(tmp_path: Path) -> None:
    from probing.errors import ProbingError

    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o755)
    with Target("dies.py", via="env", env=record_env(loose)) as job:
        send(job, "thread-raise")  # its record is refused too: kept as a failure
        assert wait_until(lambda: "thread died" in job.stdout_lines, 30), job.output()
        with pytest.raises(ProbingError) as caught:
            ask_for_record(job.pid)
        assert f"{loose} has mode 755, not 700" in caught.value.message
        assert job.finish() == 0
    assert os.listdir(loose) == []
