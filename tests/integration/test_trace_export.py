"""`probing TARGET trace export` on real traced torch jobs: the file's spans against the rows of
python.torch_trace, --steps, stdout, a record, every rank of a torchrun job, and the clear errors
of a job that does not trace or has no torch."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from trace_events import check_hierarchy, check_tracks_nest, load_trace, spans

from probing.errors import ExitCode

from support import Target, TorchrunJob, probing, wait_until

pytest.importorskip("torch")

STEPS = 12


def rows(target: str, sql: str) -> List[Dict[str, Any]]:
    result = probing(target, "query", sql, "--format", "json")
    assert result.returncode == 0, result.stderr
    found: List[Dict[str, Any]] = json.loads(result.stdout)
    return found


def export(target: str, path: Path, *args: str) -> Dict[str, Any]:
    result = probing(target, "trace", "export", "-o", str(path), *args)
    assert result.returncode == 0, result.stderr
    assert f"probing: wrote {path} (" in result.stderr and "ui.perfetto.dev" in result.stderr
    document = load_trace(path.read_text())
    check_tracks_nest(document)
    check_hierarchy(document)
    return document


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A torch job that trained STEPS steps with every step traced, backward too, then idles:
    its python.torch_trace no longer changes."""
    records = tmp_path_factory.mktemp("records")
    args = ["--slow", "--gate", "--steps", str(STEPS)]
    with Target("torch_job.py", via="plain", args=args, env={"PROBING_RECORD_DIR": str(records)}) as job:
        on = probing(str(job.pid), "trace", "on", "--backward", "--every", "1")
        assert on.returncode == 0, on.stderr
        job.process.stdin.write(b"go\n")  # type: ignore[union-attr]
        job.process.stdin.flush()  # type: ignore[union-attr]
        assert wait_until(lambda: "done" in job.stdout_lines, 120, 0.1), job.output()
        yield job


def test_every_row_is_a_span_of_its_duration_inside_its_step(traced: Target, tmp_path: Path) -> None:
    document = export(str(traced.pid), tmp_path / "step.json")
    table = rows(
        str(traced.pid),
        "SELECT step, seq, module, stage, duration FROM python.torch_trace ORDER BY step, seq",
    )
    calls = sorted(
        (e for e in spans(document) if e["cat"] != "step"),
        key=lambda e: (e["args"]["step"], e["args"]["seq"]),
    )
    assert [(e["args"]["step"], e["args"]["module"], e["args"]["stage"]) for e in calls] == [
        (row["step"], row["module"], row["stage"]) for row in table
    ]
    assert Counter(row["stage"] for row in table).keys() == {"forward", "backward", "optimizer"}
    for event, row in zip(calls, table):
        assert event["args"]["duration_s"] == row["duration"]
        if row["stage"] == "backward":
            # a parent stretched over a child a hook's order put a microsecond outside it
            assert row["duration"] * 1e6 - 1 <= event["dur"] <= row["duration"] * 1e6 + 60, (event, row)
        else:
            assert abs(event["dur"] - row["duration"] * 1e6) <= 1, (event, row)
    steps = [e for e in spans(document) if e["cat"] == "step"]
    assert sorted(e["args"]["step"] for e in steps) == sorted({row["step"] for row in table})
    threads = {e["tid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {1: "training thread", 2: "backward"}
    process = next(e for e in document["traceEvents"] if e["name"] == "process_name")
    assert process["pid"] == traced.pid and process["args"]["name"] == f"PID {traced.pid}"
    # the slow module's forward dominates its step, as in the rows
    slow = [e for e in calls if e["args"]["module"] == "model.2" and e["cat"] == "forward"]
    assert all(e["dur"] >= 20_000 for e in slow)
    rss = [e for e in document["traceEvents"] if e["name"] == "RSS (MB)"]
    assert rss and all(e["args"]["MB"] > 0 for e in rss)


def test_steps_cut_the_export(traced: Target, tmp_path: Path) -> None:
    cut = export(str(traced.pid), tmp_path / "cut.json", "--steps", "3:5")
    assert {e["args"]["step"] for e in spans(cut)} == {3, 4, 5}
    one = export(str(traced.pid), tmp_path / "one.json", "--steps", "7")
    assert {e["args"]["step"] for e in spans(one)} == {7}
    head = export(str(traced.pid), tmp_path / "head.json", "--steps", ":1")
    assert {e["args"]["step"] for e in spans(head)} == {0, 1}
    beyond = probing(str(traced.pid), "trace", "export", "-o", str(tmp_path / "none.json"), "--steps", "500:")
    assert beyond.returncode == ExitCode.ERROR and "none of --steps 500:" in beyond.stderr
    assert not (tmp_path / "none.json").exists()


def test_dash_writes_the_trace_to_stdout(traced: Target) -> None:
    result = probing(str(traced.pid), "trace", "export", "-o", "-", "--steps", "2")
    assert result.returncode == 0 and result.stderr == ""
    document = load_trace(result.stdout)
    assert {e["args"]["step"] for e in spans(document)} == {2}


def test_a_record_of_the_job_exports_the_same_spans(traced: Target, tmp_path: Path) -> None:
    written = probing(str(traced.pid), "record", "--reason", "timeline test", "--format", "json")
    if "unknown method 'record'" in written.stderr:
        pytest.skip("the agent's `record` method comes with the agent side of issue 15")
    assert written.returncode == 0, written.stderr
    record = json.loads(written.stdout)["path"]
    live = export(str(traced.pid), tmp_path / "live.json")
    recorded = export(record, tmp_path / "record.json")

    def shape(document: Dict[str, Any]) -> List[Any]:
        return sorted((e["args"].get("step"), e["name"], e["ts"], e["dur"]) for e in spans(document))

    assert shape(recorded) == shape(live)
    name = next(e for e in recorded["traceEvents"] if e["name"] == "process_name")["args"]["name"]
    assert name == f"PID {traced.pid} (record)"
    ranks = probing(record, "trace", "export", "-o", str(tmp_path / "x.json"), "--ranks", "all")
    assert ranks.returncode == ExitCode.NOT_LIVE


def test_a_job_that_does_not_trace_and_one_without_torch_get_clear_errors(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    with Target("torch_job.py", via="plain") as job:
        result = probing(str(job.pid), "trace", "export", "-o", str(out))
        assert result.returncode == ExitCode.ERROR, result.stderr
        assert "python.torch_trace is empty: tracing is off" in result.stderr
        assert f"probing {job.pid} trace on" in result.stderr and "Traceback" not in result.stderr
    with Target("sleeper.py", via="plain") as job:
        result = probing(str(job.pid), "trace", "export", "-o", str(out))
        assert result.returncode == ExitCode.NO_TORCH, result.stderr
        assert "has not imported torch" in result.stderr and "Traceback" not in result.stderr
        assert job.alive()
    assert not out.exists()


def test_tracing_on_before_any_step_says_so_and_a_bad_path_fails_before_asking(tmp_path: Path) -> None:
    with Target("torch_job.py", via="plain", args=["--gate"]) as job:
        on = probing(str(job.pid), "trace", "on")
        assert on.returncode == 0, on.stderr
        result = probing(str(job.pid), "trace", "export", "-o", str(tmp_path / "x.json"))
        assert result.returncode == ExitCode.ERROR, result.stderr
        assert "tracing is on, but no traced call has ended" in result.stderr, result.stderr
        missing = tmp_path / "no such directory" / "x.json"
        result = probing("-v", str(job.pid), "trace", "export", "-o", str(missing))
        assert result.returncode == ExitCode.USAGE, result.stderr
        assert f"cannot write {missing}" in result.stderr
        assert "fetching" not in result.stderr  # the job was not asked for its rows
        assert job.alive()


def test_every_rank_of_a_torchrun_job_is_a_process(tmp_path: Path) -> None:
    with TorchrunJob("healthy", ranks=2) as job:
        on = probing(str(job.agent_pid), "trace", "on", "--every", "1", "--ranks", "all")
        assert on.returncode == 0, on.stderr

        def traced_steps(rank: int) -> int:
            found = rows(str(job.pids[rank]), "SELECT count(DISTINCT step) AS n FROM python.torch_trace")
            return int(found[0]["n"])

        assert wait_until(lambda: min(traced_steps(0), traced_steps(1)) >= 3, 120, 0.2)
        document = export(str(job.agent_pid), tmp_path / "job.json", "--ranks", "all")
        names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"}
        assert names == {job.pids[rank]: f"rank {rank} (PID {job.pids[rank]})" for rank in (0, 1)}
        for rank in (0, 1):
            steps = [e for e in spans(document) if e["pid"] == job.pids[rank] and e["cat"] == "step"]
            assert len(steps) >= 3
        # on one wall clock: the ranks step together (an all_reduce each step), within a second
        first = {e["pid"]: e["ts"] for e in spans(document) if e["cat"] == "step"}
        assert abs(first[job.pids[0]] - first[job.pids[1]]) < 1_000_000
        partial = export(str(job.agent_pid), tmp_path / "one.json", "--ranks", "1", "--steps", "1:")
        assert {e["pid"] for e in spans(partial)} == {job.pids[1]}
        # A rank that cannot answer (frozen): the others' file, that rank named, exit 14.
        os.kill(job.pids[1], signal.SIGSTOP)
        try:
            out = tmp_path / "missing.json"
            missing = probing(str(job.agent_pid), "trace", "export", "-o", str(out), "--ranks", "all",
                              "--timeout", "3")  # fmt: skip
        finally:
            os.kill(job.pids[1], signal.SIGCONT)
        assert missing.returncode == ExitCode.PARTIAL, missing.stderr
        assert "rank 1" in missing.stderr and f"probing: wrote {out} (" in missing.stderr
        document = load_trace(out.read_text())
        check_tracks_nest(document)
        check_hierarchy(document)
        assert {e["pid"] for e in spans(document)} == {job.pids[0]}
