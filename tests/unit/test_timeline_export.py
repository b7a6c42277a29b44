"""`trace export` around the events: --steps parsed and cut in SQL, the rows read from a session,
the file written atomically, and the options that do not go together refused."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from click.testing import CliRunner
from test_timeline import FakeClock, nested_steps
from trace_events import check_hierarchy, check_tracks_nest, load_trace

from probing.cli import group
from probing.cli.pictures.timeline import Counted, ProcessTrack, Timeline, trace_document
from probing.cli.render import files
from probing.engine.query import static_session
from probing.engine.timeline import EVERY_STEP, StepRange, TimelineRows, parse_steps
from probing.errors import ExitCode, ProbingError
from probing.schema.tables import AGENT_TABLES

TORCH_TRACE = AGENT_TABLES["python.torch_trace"]
NAN_EVENTS = AGENT_TABLES["python.nan_events"]
MEMORY = AGENT_TABLES["process.memory"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3:7", StepRange(3, 7)),
        ("3:", StepRange(3, None)),
        (":7", StepRange(None, 7)),
        ("5", StepRange(5, 5)),
        (":", StepRange(None, None)),
        (" 2 : 4 ", StepRange(2, 4)),
    ],
)
def test_step_ranges_parse(text: str, expected: StepRange) -> None:
    assert parse_steps(text) == expected


@pytest.mark.parametrize("text", ["", "a:b", "7:3", "1:2:3", "-1", "1.5", "x"])
def test_bad_step_ranges_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_steps(text)


def session_with_rows(steps: int = 8) -> Any:
    """A DuckDB session holding torch_trace rows as the agent stamps them, a NaN event at step 5
    and memory samples, loaded the way plain rows are (TIMESTAMP as epoch seconds)."""
    clock = FakeClock()
    nested_steps(clock, steps, random.Random(11))
    session = static_session()
    # FakeClock's last column is ts in microseconds; the table's is seconds.
    trace = [(*row[1:11], 0, row[11] / 1e6, 1) for row in clock.rows]  # one tracing session
    session.load_rows(TORCH_TRACE, trace)
    at = clock.rows[min(40, len(clock.rows) - 1)][11] / 1e6
    session.load_rows(
        NAN_EVENTS,
        [
            (5, 3, "model.layers", "ModuleList", "forward", "out", 1, 0, True, None, None, 0, at),
            (1, 3, "model.layers", "ModuleList", "forward", "out", 1, 0, True, None, None, 0, at),
        ],
    )
    first, last = clock.rows[0][11] / 1e6, clock.rows[-1][11] / 1e6
    samples = [(first - 10 + second, 800.0 + second, 0, 0, 0, 0, None, None, None) for second in range(60)]
    session.load_rows(MEMORY, samples)
    assert first < last
    return session, clock


def rows_of(session: Any, steps: StepRange) -> TimelineRows:
    return TimelineRows(session, "0", steps, [(0, 77, "PID 77")], [], [])


def document_of(rows: TimelineRows) -> Any:
    timeline = Timeline([ProcessTrack(key, pid, name) for key, pid, name in rows.processes])

    def events() -> Iterator[str]:
        yield from timeline.process_events()
        yield from timeline.trace_events(rows.trace_rows())
        yield from timeline.nan_events(rows.nan_rows())
        yield from timeline.memory_events(rows.memory_rows())

    return load_trace("".join(trace_document(Counted(events()), {})))


def test_steps_cut_the_spans_the_nan_events_and_the_memory_window() -> None:
    session, clock = session_with_rows()
    whole = document_of(rows_of(session, EVERY_STEP))
    cut = document_of(rows_of(session, StepRange(3, 5)))
    check_tracks_nest(cut)
    check_hierarchy(cut)

    def steps(document: Any) -> List[int]:
        return sorted({e["args"]["step"] for e in document["traceEvents"] if e["ph"] == "X"})

    assert steps(whole) == list(range(8)) and steps(cut) == [3, 4, 5]
    calls = [e for e in cut["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"]
    assert len(calls) == sum(1 for row in clock.rows if 3 <= row[1] <= 5)
    assert [e["args"]["step"] for e in cut["traceEvents"] if e["ph"] == "i"] == [5]
    rss = [e["ts"] for e in cut["traceEvents"] if e["name"] == "RSS (MB)"]
    spans = [e for e in cut["traceEvents"] if e["ph"] == "X"]
    low, high = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    assert rss and all(low - 1_000_000 <= ts <= high + 1_000_000 for ts in rss)
    assert len([e for e in whole["traceEvents"] if e["name"] == "RSS (MB)"]) >= len(rss)


def test_the_spans_match_the_rows_read_back_with_sql() -> None:
    session, _ = session_with_rows(4)
    document = document_of(rows_of(session, EVERY_STEP))
    table = session.run(
        "SELECT step, module, stage, duration FROM python.torch_trace ORDER BY step, seq"
    ).rows
    calls = [e for e in document["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"]
    calls.sort(key=lambda e: (e["args"]["step"], e["args"]["seq"]))
    assert [(e["args"]["step"], e["args"]["module"], e["args"]["stage"]) for e in calls] == [
        r[:3] for r in table
    ]
    assert all(abs(e["dur"] - row[3] * 1e6) <= 1 for e, row in zip(calls, table))


# --- the file ------------------------------------------------------------------------------


def test_write_output_replaces_a_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "step.json"
    target.write_text("old")
    size = files.write_output(str(target), iter(["{", '"a":', "1}", "é"]))
    assert target.read_text(encoding="utf-8") == '{"a":1}é' and size == len('{"a":1}é'.encode())
    assert os.listdir(tmp_path) == ["step.json"]


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "step.json"
    target.write_text("old")

    def parts() -> Iterator[str]:
        yield "new"
        raise ProbingError("the target went away")

    with pytest.raises(ProbingError):
        files.write_output(str(target), parts())
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["step.json"]


def test_write_output_does_not_follow_a_symlink_planted_at_a_temporary_name(tmp_path: Path) -> None:
    # The temporary name is random (mkstemp): one planted where an older probing put it is
    # neither written through nor in the way.
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / f".out.json.tmp-{os.getpid()}").symlink_to(victim)
    files.write_output(str(tmp_path / "out.json"), iter(["x"]))
    assert victim.read_text() == "keep" and (tmp_path / "out.json").read_text() == "x"


def test_a_directory_that_does_not_exist_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProbingError, match="No such file or directory"):
        files.write_output(str(tmp_path / "nowhere" / "x.json"), iter(["x"]))


def test_dash_writes_stdout_and_wrote_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert files.write_output("-", iter(["ab", "c"])) == 3
    files.wrote("-", 3, "1 event")
    captured = capsys.readouterr()
    assert captured.out == "abc" and captured.err == ""


def test_wrote_says_what_was_written_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    files.wrote("step\x1b.json", 1_234_567, "51,210 events", "open it in https://ui.perfetto.dev")
    assert capsys.readouterr().err == (
        "probing: wrote step\\x1b.json (1.2 MB, 51,210 events): open it in https://ui.perfetto.dev\n"
    )
    assert files.human_size(999) == "999 B" and files.human_size(1500) == "1.5 kB"


# --- the command line ----------------------------------------------------------------------


def invoke(*args: str) -> Any:
    return CliRunner().invoke(group.cli, list(args), prog_name="probing")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trace", "export"], "needs -o/--output FILE"),
        (["trace", "on", "-o", "x.json"], "--output only go with 'trace export'"),
        (["trace", "status", "--steps", "1:2"], "--steps only go with 'trace export'"),
        (["trace", "export", "-o", "x.json", "--every", "2"], "--every only go with 'trace on'"),
        (["trace", "export", "-o", "x.json", "--format", "json"], "--format does not go with 'trace export'"),
        (["trace", "export", "-o", "x.json", "--steps", "9:2"], "ends before it starts"),
        (["trace", "export", "-o", "x.json", "--steps", "a"], "give A:B, A:, :B or N"),
    ],
)
def test_options_that_do_not_go_together_are_usage_errors(args: List[str], message: str) -> None:
    result = invoke("1", *args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert message in result.output


def test_the_help_shows_export() -> None:
    result = invoke("1", "trace", "--help")
    assert "trace export -o step.json" in result.output and "--steps A:B" in result.output


def test_json_loads_what_files_wrote_from_a_trace(tmp_path: Path) -> None:
    session, _ = session_with_rows(2)
    rows = rows_of(session, EVERY_STEP)
    timeline = Timeline([ProcessTrack(0, 77, "PID 77")])
    out = tmp_path / "t.json"
    size = files.write_output(str(out), trace_document(Counted(timeline.trace_events(rows.trace_rows())), {}))
    assert size == out.stat().st_size and json.loads(out.read_text())["traceEvents"]
    assert io.StringIO(out.read_text()).read().endswith("}\n")
