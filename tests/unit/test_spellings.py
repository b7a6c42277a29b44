"""Command lines spelled as py-spy, pystack or gdb spell them, or with the command before the
PID: refused in one line that names probing's spelling, exit 2, and nothing run on a guess."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest

from probing.cli import main
from probing.engine.target import Target
from probing.errors import ExitCode


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any command that went on to act on a process would make a Target first."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a command ran on a guess")

    monkeypatch.setattr(Target, "__init__", refuse)


GOES_BEFORE = "the TARGET goes before the command"
PY_SPY = "is py-spy's spelling; probing's"


@pytest.mark.parametrize(
    "args, whose, suggestion",
    [
        (["backtrace", "5259"], GOES_BEFORE, "probing 5259 backtrace"),
        (["backtrace", "--thread", "12", "5259"], GOES_BEFORE, "probing 5259 backtrace --thread 12"),
        (["-v", "eval", "5259", "print(1)"], GOES_BEFORE, "probing -v 5259 eval 'print(1)'"),
        (["trace", "5259", "on"], GOES_BEFORE, "probing 5259 trace on"),
        (["dump", "--pid", "5259"], f"`dump --pid 5259` {PY_SPY}", "probing 5259 backtrace"),
        (["dump", "--pid", "5259", "--native", "-l"], PY_SPY, "probing 5259 backtrace --native --locals"),
        (["dump", "-p", "5259", "--subprocesses"], PY_SPY, "probing 5259 backtrace --children"),
        (
            ["record", "--pid", "5259", "-o", "f.svg", "-d", "5"],
            f"`record --pid 5259` {PY_SPY}",
            "probing 5259 flamegraph -o f.svg --duration 5",
        ),
        (["record", "--pid", "5259"], PY_SPY, "probing 5259 flamegraph -o profile.svg"),
        (["top", "--pid", "5259"], f"`top --pid 5259` {PY_SPY}", "probing 5259 flamegraph -o cpu.html"),
        (["remote", "5259"], "`remote PID` is pystack's spelling; probing's", "probing 5259 backtrace"),
        (
            ["remote", "5259", "--locals", "--native-all"],
            "pystack's",
            "probing 5259 backtrace --locals --native",
        ),
        (["-p", "5259"], "`-p 5259` is gdb's and py-spy's spelling; probing's", "probing 5259 backtrace"),
        (["-p", "5259", "record"], "`-p 5259` is gdb's", "probing 5259 record"),
        (["--pid=5259", "hang"], "`--pid=5259` is gdb's", "probing 5259 hang"),
        (["5259", "dump"], f"`dump` {PY_SPY}", "probing 5259 backtrace"),
    ],
)
def test_another_tools_spelling_gets_probings_in_one_line(
    capsys: pytest.CaptureFixture[str], args: List[str], whose: str, suggestion: str
) -> None:
    assert main(args) == ExitCode.USAGE
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("probing: error: ") and err.endswith(f": {suggestion}\n"), err
    assert err.count("\n") == 1 and whose in err


def test_pystacks_core_with_its_executable_gets_exe(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    core, executable = tmp_path / "core.1", tmp_path / "python3"
    core.write_bytes(b"")
    executable.write_bytes(b"")
    assert main(["core", str(core), str(executable)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err == (
        f"probing: error: `core CORE EXECUTABLE` is pystack's spelling; probing's: "
        f"probing core {core} --exe {executable}\n"
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["backtrace"], "missing TARGET"),  # no PID anywhere: nothing to suggest
        (["4242", "nosuchcommand"], "No such command"),
        (["4242", "eval", "-p", "3"], "No such option '-p'"),  # a PID already given: -p is no habit
        (["eval", "x = 1"], "missing TARGET"),
    ],
)
def test_a_refusal_no_habit_explains_is_left_as_it_was(
    capsys: pytest.CaptureFixture[str], args: List[str], said: str
) -> None:
    assert main(args) == ExitCode.USAGE
    assert said in capsys.readouterr().err
