"""The agent side of records, as pure functions: why a job ended, names, retention, size bounds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest

from probing.agent.records import retention, settings
from probing.agent.records.classify import describe, exit_status, reason_kind
from probing.agent.records.writer import _bounded
from probing.agent.ring import Ring
from probing.engine.records.listing import list_pruned
from probing.protocol.tables import decode_table


class DistBackendError(RuntimeError):
    pass


class NonFiniteError(FloatingPointError):
    pass


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        # What gloo raises in torch 2.13 (CPU) when a peer never joins a collective.
        (
            RuntimeError(
                "[/x/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                "2000ms for recv operation to complete"
            ),
            "collective_timeout",
        ),  # fmt: skip
        (
            DistBackendError(
                "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
                "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."
            ),
            "collective_timeout",
        ),  # fmt: skip
        (DistBackendError("NCCL error: unhandled system error"), "exception"),
        (TimeoutError("the data loader timed out"), "exception"),
        (NonFiniteError("probing: 1 NaN in model.2"), "nan"),
        (ValueError("bad"), "exception"),
    ],
)
def test_reason_kind(error: BaseException, kind: str) -> None:
    assert reason_kind(error) == kind


def test_exit_status_of_what_reaches_the_top() -> None:
    assert exit_status(ValueError()) == 1
    assert exit_status(KeyboardInterrupt()) == -2
    assert (exit_status(SystemExit(3)), exit_status(SystemExit()), exit_status(SystemExit("no"))) == (3, 0, 1)


def test_describe_keeps_the_frames_outermost_first() -> None:
    def inner() -> None:
        raise KeyError("k")

    try:
        inner()
    except KeyError as error:
        described = describe(error, "MainThread")
    assert described["type"] == "builtins.KeyError" and described["message"] == "'k'"
    assert [frame["func"] for frame in described["frames"]][-1] == "inner"
    assert described["text"].startswith("Traceback (most recent call last)")


def test_a_broken_str_does_not_break_the_description() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert "str() raised" in describe(Hostile(), "t")["message"]


@pytest.mark.parametrize(
    ("argv", "stem"),
    [
        (["train.py", "--lr", "1"], "train"),
        (["/a/b/my job!.py"], "my_job_"),
        (["-c"], "python"),
        ([], "python"),
        (["/site/pkg/trainer/__main__.py"], "trainer"),
        (["x" * 80 + ".py"], "x" * 40),
    ],
)
def test_stem(argv: List[str], stem: str) -> None:
    assert settings.stem(argv) == stem


def test_settings_from_the_environment() -> None:
    assert settings.enabled({}) and not settings.enabled({"PROBING_RECORD": "0"})
    assert retention.retention({"PROBING_RECORD_KEEP": "x"}).keep_per_job == retention.DEFAULT_KEEP
    assert retention.retention({"PROBING_RECORD_KEEP": "0"}).keep_per_job == 1
    bounds = retention.retention({"PROBING_RECORD_TOTAL_FILES": "nan", "PROBING_RECORD_TOTAL_MB": "0.5"})
    assert bounds.total_files == retention.DEFAULT_TOTAL_FILES and bounds.total_bytes == 1 << 19
    assert settings.max_bytes({"PROBING_RECORD_MAX_MB": "0.5"}) == 1 << 19
    assert settings.record_dir({"PROBING_SOCKET_DIR": "/s"}) == "/s/records"
    assert settings.record_dir({"PROBING_RECORD_DIR": "/r", "PROBING_SOCKET_DIR": "/s"}) == "/r"


def test_prepare_dir_refuses_what_others_could_read_or_swap(tmp_path: Path) -> None:
    made = settings.prepare_dir(str(tmp_path / "new"))
    assert os.stat(made).st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o755)
    with pytest.raises(settings.RecordDirRefused, match="mode 755"):
        settings.prepare_dir(str(loose))
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(settings.RecordDirRefused, match="symbolic link"):
        settings.prepare_dir(str(tmp_path / "link"))


def test_prune_keeps_the_newest_of_each_job(tmp_path: Path) -> None:
    for index in range(5):
        path = tmp_path / f"job-{100 + index}-20260101-00000{index}.probing"
        path.write_bytes(b"")
        os.utime(path, (1000 + index, 1000 + index))
    # .fatal files of processes that are gone (PIDs over pid_max, renamed ones) are the job's
    # records too; a live process's own is never touched.
    for index, name in enumerate(["job-4999999.fatal", "job-4999998.fatal", "job-1-1700000000.fatal"]):
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (900 + index, 900 + index))
    (tmp_path / f"job-{os.getpid()}.fatal").write_bytes(b"")
    os.utime(tmp_path / f"job-{os.getpid()}.fatal", (1, 1))
    (tmp_path / "other-7-20260101-000000.probing").write_bytes(b"")
    os.utime(tmp_path / "other-7-20260101-000000.probing", (1, 1))  # the oldest of all, alone in its job
    removed = retention.prune(str(tmp_path), retention.Retention(2, 100, 1 << 30))
    names = sorted(os.path.basename(path) for path in removed)
    assert names == sorted([
        "job-100-20260101-000000.probing", "job-101-20260101-000001.probing",
        "job-102-20260101-000002.probing", "job-4999999.fatal", "job-4999998.fatal",
        "job-1-1700000000.fatal",
    ])  # fmt: skip
    assert sorted(name for name in os.listdir(tmp_path) if not name.startswith(".")) == sorted([
        f"job-{os.getpid()}.fatal", "job-103-20260101-000003.probing", "job-104-20260101-000004.probing",
        "other-7-20260101-000000.probing",
    ])  # fmt: skip


def _records(directory: Path, job: str, count: int, first: int, size: int = 0) -> List[str]:
    names = []
    for index in range(count):
        name = f"{job}-{first + index}-20260101-000000.probing"
        (directory / name).write_bytes(b"x" * size)
        os.utime(directory / name, (first + index, first + index))
        names.append(name)
    return names


def test_the_total_bounds_take_from_the_job_with_the_most(tmp_path: Path) -> None:
    """Over PROBING_RECORD_TOTAL_FILES, the oldest record of the job with the most records goes
    (not the oldest record of the directory: another job's only incident); over
    PROBING_RECORD_TOTAL_MB, that of the job holding the most bytes."""
    incident = _records(tmp_path, "train", 1, 1000)  # the oldest of all
    chatty = _records(tmp_path, "poller", 6, 2000)
    removed = retention.prune(str(tmp_path), retention.Retention(20, 4, 1 << 30))
    assert sorted(os.path.basename(path) for path in removed) == chatty[:3]
    assert (tmp_path / incident[0]).exists()
    big = _records(tmp_path, "big", 2, 3000, 600_000)
    removed = retention.prune(str(tmp_path), retention.Retention(20, 100, 1 << 20))
    assert [os.path.basename(path) for path in removed] == big[:1]
    # The record just written stays, even alone over the bounds.
    retention.prune(str(tmp_path), retention.Retention(1, 1, 0), written=str(tmp_path / big[1]))
    assert sorted(name for name in os.listdir(tmp_path) if not name.startswith(".")) == [big[1]]


def test_what_was_pruned_is_logged_with_why(tmp_path: Path) -> None:
    _records(tmp_path, "train", 1, 1000, 10)
    poller = _records(tmp_path, "poller", 3, 2000, 10)
    retention.prune(str(tmp_path), retention.Retention(2, 2, 1 << 30))
    pruned = list_pruned([str(tmp_path)], given=True)
    assert sorted(os.path.basename(entry.path) for entry in pruned) == poller[:2]
    reasons = sorted(entry.reason for entry in pruned)
    assert all(entry.kind == "pruned" and entry.pid in (2000, 2001) and entry.size == 10 for entry in pruned)
    assert "PROBING_RECORD_KEEP=2 keeps the newest 2 of each job" in reasons[0] + reasons[1]
    assert any(
        "over PROBING_RECORD_TOTAL_FILES=2: the oldest of job 'poller'" in reason for reason in reasons
    )
    assert all(reason.startswith("pruned ") and f"by PID {os.getpid()}" in reason for reason in reasons)
    # A line no agent wrote (a hostile one) is skipped; the log is rotated, and both parts read.
    with open(tmp_path / ".pruned.jsonl", "ab") as log:
        log.write(b'{"name": "../x.probing", "why": 1}\nnot json\n')
    assert len(list_pruned([str(tmp_path)], given=True)) == 2
    os.rename(tmp_path / ".pruned.jsonl", tmp_path / ".pruned.1.jsonl")
    retention.log_pruned(str(tmp_path), [dict(name="a-1-20260101-000000.probing", job="a", bytes=1,
                                              written_at=1.0, pruned_at=2e9, by_pid=1, why="w")])  # fmt: skip
    assert [entry.pid for entry in list_pruned([str(tmp_path)], given=True)][0] == 1


def test_prune_removes_temporary_files_of_cut_writes_once_old(tmp_path: Path) -> None:
    old = tmp_path / ".job-1-20260101-000000.probing.1.tmp"
    new = tmp_path / ".job-2-20260101-000000.probing.2.tmp"
    for path in (old, new):
        path.write_bytes(b"")
    os.utime(old, (1000, 1000))  # a write cut by SIGKILL long ago
    assert retention.prune(str(tmp_path), retention.retention({})) == [str(old)]
    assert os.listdir(tmp_path) == [new.name]  # one may be being written now


def test_a_ring_over_the_budget_is_cut_to_its_newest_rows() -> None:
    ring = Ring("python.torch_trace", [("step", "BIGINT"), ("duration", "DOUBLE")], 16_000)
    for step in range(16_500):  # the newest 500 still in the block being filled
        ring.append((step, 0.5))
    notes: List[str] = []
    whole = _bounded("python.torch_trace", ring, 1 << 30, notes)
    assert whole is not None and whole[0]["rows"] == len(ring) and notes == []
    cut = _bounded("python.torch_trace", ring, 60_000, notes)
    assert cut is not None
    steps = decode_table(cut[0], b"".join(bytes(chunk) for chunk in cut[1])).column("step").to_pylist()
    assert 0 < len(steps) < len(ring) and steps[-1] == 16_499 and steps == sorted(steps)
    assert "cut to its newest" in notes[0]
    assert _bounded("python.torch_trace", ring, 10, notes) is None and "left out" in notes[-1]
