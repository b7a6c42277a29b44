"""The error tree: exit codes, the hint each class carries, and the error every kind of agent
error reply becomes."""

from __future__ import annotations

from typing import Type

import pytest

from probing import errors
from probing.client.replies import ERROR_OF_KIND, error_from_reply
from probing.errors import ExitCode, ProbingError
from probing.protocol.messages import ErrorKind, error_reply, parse_reply

ERROR_CLASSES = [
    value for value in vars(errors).values() if isinstance(value, type) and issubclass(value, ProbingError)
]


def test_error_kind_all_lists_every_kind_once() -> None:
    constants = {value for name, value in vars(ErrorKind).items() if name.isupper() and name != "ALL"}
    assert sorted(ErrorKind.ALL) == sorted(constants)
    assert len(set(ErrorKind.ALL)) == len(ErrorKind.ALL)


def test_every_error_kind_maps_to_a_probing_error() -> None:
    assert set(ERROR_OF_KIND) == set(ErrorKind.ALL)


@pytest.mark.parametrize("kind", ErrorKind.ALL)
def test_each_kind_of_error_reply_becomes_its_error(kind: str) -> None:
    _, ok, body = parse_reply(error_reply(7, kind, "what went wrong"))
    assert not ok
    error = error_from_reply(body)
    assert type(error) is ERROR_OF_KIND[kind]
    assert "what went wrong" in error.message


def test_a_kind_this_cli_does_not_know_is_a_plain_error() -> None:
    error = error_from_reply({"type": "SomethingNewer", "message": "from a newer agent"})
    assert type(error) is ProbingError
    assert error.message == "from a newer agent"
    assert error.exit_code == ExitCode.ERROR


def test_busy_and_a_protocol_mismatch_are_unreachable_agents() -> None:
    """backtrace falls back to reading from outside on AgentUnreachable."""
    for kind in (ErrorKind.BUSY, ErrorKind.PROTOCOL_MISMATCH):
        assert isinstance(error_from_reply({"type": kind, "message": "m"}), errors.AgentUnreachable)


def test_remote_error_keeps_the_traceback_and_output() -> None:
    body = {
        "type": ErrorKind.REMOTE_ERROR,
        "message": "ZeroDivisionError",
        "traceback": "tb",
        "stdout": "out",
    }
    error = error_from_reply(body)
    assert isinstance(error, errors.RemoteError)
    assert (error.traceback, error.stdout, error.exit_code) == ("tb", "out", ExitCode.REMOTE_ERROR)


def test_an_internal_error_says_it_is_a_bug() -> None:
    error = error_from_reply({"type": ErrorKind.INTERNAL_ERROR, "message": "KeyError: 'x'"})
    assert error.message == "the agent failed: KeyError: 'x'"
    assert error.hint is not None and "bug" in error.hint


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_exit_code_is_documented(cls: Type[ProbingError]) -> None:
    assert cls.exit_code in ExitCode.MEANINGS


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (errors.UsageError, ExitCode.USAGE),
        (errors.ProcessNotFound, ExitCode.NO_SUCH_PROCESS),
        (errors.NotPython, ExitCode.NOT_PYTHON),
        (errors.PermissionDenied, ExitCode.PERMISSION_DENIED),
        (errors.UntrustedSocket, ExitCode.PERMISSION_DENIED),
        (errors.NoAgent, ExitCode.NO_AGENT),
        (errors.AgentTimeout, ExitCode.AGENT_TIMEOUT),
        (errors.EvalTimedOut, ExitCode.AGENT_TIMEOUT),
        (errors.RemoteError, ExitCode.REMOTE_ERROR),
        (errors.BadSQL, ExitCode.BAD_SQL),
        (errors.AttachTimeout, ExitCode.ATTACH_TIMEOUT),
        (errors.NoTorch, ExitCode.NO_TORCH),
        (errors.NoCuda, ExitCode.NO_TORCH),
        (errors.BadReply, ExitCode.BAD_REPLY),
        (errors.AgentUnreachable, ExitCode.ERROR),
        (errors.AgentBusy, ExitCode.ERROR),
        (errors.RequestRefused, ExitCode.ERROR),
    ],
)
def test_exit_codes(cls: Type[ProbingError], code: int) -> None:
    assert cls.exit_code == code


def test_a_class_carries_its_default_hint() -> None:
    assert errors.PermissionDenied("no").hint == "run probing as the user that owns the process, or as root"
    assert errors.NoAgent("none").hint is not None and "probing run" in (errors.NoAgent("none").hint or "")
    assert errors.EvalTimedOut("slow").hint == "raise --timeout if the code needs longer"
    assert errors.NoCuda("cpu").hint != errors.NoTorch("none").hint


def test_a_raise_site_can_replace_or_drop_the_default_hint() -> None:
    assert errors.PermissionDenied("no", hint="use sudo").hint == "use sudo"
    assert errors.PermissionDenied("no", hint="").hint is None
    assert ProbingError("plain").hint is None
