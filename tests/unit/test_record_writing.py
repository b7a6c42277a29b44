"""The agent side of records, as pure functions: why a job ended, names, retention, size bounds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest

from probing.agent.records import settings
from probing.agent.records.classify import describe, exit_status, reason_kind
from probing.agent.records.writer import _bounded
from probing.agent.ring import Ring
from probing.protocol import decode_table


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
    assert settings.keep_count({"PROBING_RECORD_KEEP": "x"}) == settings.DEFAULT_KEEP
    assert settings.keep_count({"PROBING_RECORD_KEEP": "0"}) == 1
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


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for index in range(5):
        path = tmp_path / f"job-{index}.probing"
        path.write_bytes(b"")
        os.utime(path, (1000 + index, 1000 + index))
    # .fatal files of processes that are gone (PIDs over pid_max, renamed ones) are kept the
    # same way; a live process's own is never touched.
    for index, name in enumerate(["job-4999999.fatal", "job-4999998.fatal", "job-1-1700000000.fatal"]):
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (1000 + index, 1000 + index))
    (tmp_path / f"job-{os.getpid()}.fatal").write_bytes(b"")
    os.utime(tmp_path / f"job-{os.getpid()}.fatal", (1, 1))
    removed = settings.prune(str(tmp_path), 2)
    names = sorted(os.path.basename(path) for path in removed)
    assert names == ["job-0.probing", "job-1.probing", "job-2.probing", "job-4999999.fatal"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [
            "job-1-1700000000.fatal",
            "job-4999998.fatal",
            f"job-{os.getpid()}.fatal",
            "job-3.probing",
            "job-4.probing",
        ]
    )


def test_prune_removes_temporary_files_of_cut_writes_once_old(tmp_path: Path) -> None:
    old = tmp_path / ".job-1-20260101-000000.probing.1.tmp"
    new = tmp_path / ".job-2-20260101-000000.probing.2.tmp"
    for path in (old, new):
        path.write_bytes(b"")
    os.utime(old, (1000, 1000))  # a write cut by SIGKILL long ago
    assert settings.prune(str(tmp_path), 20) == [str(old)]
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
