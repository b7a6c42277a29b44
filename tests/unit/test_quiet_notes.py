"""Notes on stderr said once, and only where they matter: a query of a record hears about the
tables it reads, not about every table the record left out; a record path that does not exist
is "no such file", not a lecture on what TARGET may be."""

from __future__ import annotations

import array
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from probing.cli import main
from probing.errors import ExitCode
from probing.protocol.records import write_record
from probing.protocol.tables import ColumnBuffers, encode_table

# Notes as an agent writes them into a torch job's record (agent/records/writer.py).
LEFT_OUT = (
    "python.modules, python.optimizers: left out (nothing had read them live yet: reading them first "
    "would put a step hook into the dying job)"
)
NO_CUDA = "torch.cuda_memory is empty: the process has not initialised CUDA"
HOOKED = "recorded at exit: the job's own sys.excepthook had replaced probing's"


def backtrace_table() -> Tuple[Any, Any]:
    columns = [
        ColumnBuffers("pid", "BIGINT", array.array("q", [7]).tobytes(), None, None),
        ColumnBuffers("depth", "BIGINT", array.array("q", [0]).tobytes(), None, None),
        ColumnBuffers("func", "VARCHAR", array.array("i", [0]).tobytes(), None, ["train"]),
    ]
    return encode_table("python.backtrace", 1, columns)


def cuda_memory_table() -> Tuple[Any, Any]:
    columns = [
        ColumnBuffers("device", "BIGINT", b"", None, None),
        ColumnBuffers("name", "VARCHAR", b"", None, []),
        ColumnBuffers("value", "BIGINT", b"", None, None),
    ]
    return encode_table("torch.cuda_memory", 0, columns)


@pytest.fixture
def record(tmp_path: Path) -> str:
    header = {"pid": 7, "argv": ["train.py"], "written_at": 1.0, "notes": [LEFT_OUT, NO_CUDA, HOOKED]}
    return write_record(
        str(tmp_path), "train-7-20261126-000000.probing", header, [backtrace_table(), cuda_memory_table()]
    )


def notes_of(capsys: pytest.CaptureFixture[str], args: List[str]) -> List[str]:
    assert main(args) == ExitCode.OK
    return capsys.readouterr().err.splitlines()


def test_a_query_of_a_record_hears_only_about_the_tables_it_reads(
    record: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert notes_of(capsys, [record, "query", "SELECT func FROM python.backtrace WHERE depth = 0"]) == []
    assert notes_of(capsys, [record, "query", "SELECT count(*) FROM torch.cuda_memory"]) == [
        f"probing: {NO_CUDA}"
    ]


def test_a_table_the_record_left_out_is_explained_once(
    record: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record's own note says why python.modules is missing: no second note says it is."""
    assert notes_of(capsys, [record, "query", "SELECT count(*) FROM python.modules"]) == [
        f"probing: {LEFT_OUT}"
    ]
    said = notes_of(capsys, [record, "query", "SELECT count(*) FROM python.tensors"])
    assert len(said) == 1 and said[0].startswith("probing: this record does not hold python.tensors")


def test_notes_are_matched_to_whole_table_names() -> None:
    from probing.engine.records.sql import notes_about

    notes = ["python.gc_generations: objects left NULL", "process.memory: cut to its newest 10 rows", NO_CUDA]
    assert notes_about(notes, ["python.gc"]) == []
    assert notes_about(notes, ["process.memory"]) == ["process.memory: cut to its newest 10 rows"]
    assert notes_about(notes, ["torch.cuda_memory", "python.gc_generations"]) == [notes[0], NO_CUDA]


@pytest.mark.parametrize("path", ["./nope.probing", "records/nope.fatal", "/tmp/no/such/dir/x.sock"])
def test_a_record_path_that_does_not_exist_is_no_such_file(
    capsys: pytest.CaptureFixture[str], path: str
) -> None:
    assert main([path, "backtrace"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"probing: error: no such file: {path}\n") and "TARGET must be" not in err


def test_a_note_every_rank_gives_is_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`query --ranks all` over a job without CUDA: one note for the job, not one per rank; a
    note of one rank's own still names it."""
    from probing.engine import query
    from probing.engine.jobs.job import Rank

    ranks = [Rank(rank, rank, 0, 100 + rank) for rank in range(4)]

    def fetched(target: Any, *args: Any) -> Any:
        own = ["python.backtrace read from outside the process (py-spy)"] if target == 102 else []
        return query.Fetched(None, [], [], target, [NO_CUDA, *own])

    monkeypatch.setattr(query, "fetch_tables", fetched)
    tables = query.load_job_tables(ranks, lambda rank: rank.pid, "SELECT 1", 1.0, 1.0)  # type: ignore[arg-type,return-value]
    assert tables.notes == [
        f"every rank: {NO_CUDA}",
        "rank 2: python.backtrace read from outside the process (py-spy)",
    ]


def test_a_note_of_columns_left_null_reaches_only_a_query_that_reads_them() -> None:
    from probing.sql.session import notes_on_what_is_read

    objects = "python.gc_generations: objects left NULL: gc's generation 2 was not listed"
    norms = "python.modules: grad_norm and has_nonfinite_grad left NULL: the job did not step"
    notes = [objects, norms, NO_CUDA]
    assert notes_on_what_is_read(notes, "SELECT generation, threshold FROM python.gc_generations") == [
        NO_CUDA
    ]
    assert notes_on_what_is_read(notes, "SELECT generation, objects FROM python.gc_generations") == [
        objects,
        NO_CUDA,
    ]
    assert notes_on_what_is_read(notes, "SELECT * FROM python.gc_generations") == notes
    assert notes_on_what_is_read(notes, "SELECT name, has_nonfinite_grad FROM python.modules") == [
        norms,
        NO_CUDA,
    ]
    assert notes_on_what_is_read(notes, "SELECT name FROM python.modules WHERE grad_norm > 1") == [
        norms,
        NO_CUDA,
    ]
    assert notes_on_what_is_read(notes, "SELECT name, grad_norm_x FROM python.modules") == [NO_CUDA]
    assert notes_on_what_is_read(notes, "SELECT g.OBJECTS FROM python.gc_generations g") == [objects, NO_CUDA]
