"""What a TARGET names, as one kind with one interface (base.Kind): a live process (a PID, an
agent's socket, tcp://HOST:PORT), a job of ranks (`--ranks`, `--endpoints`), a record, a core
file. A command asks its Kind and renders the answer; it never asks which kind it has.

A kind of file is added by its module and one line of FILE_KINDS: how to tell the file is one,
and how to open it.

Standard library only, no typing at run time: `probing PID backtrace` starts through here
(cli/fast.py).
"""

from __future__ import annotations

from ...errors import NotLive
from ..records.path import is_record_path
from .base import Kind, One, Ranks, Rows

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Tuple, Type

    Log = Callable[[str], None]

__all__ = ["Kind", "One", "Options", "Ranks", "Rows", "names_a_file_kind", "resolve"]


def _quiet(message: str) -> None:
    pass


class Options:
    """The global options every kind is found with: -v's `log`, --no-attach, --attach-timeout."""

    __slots__ = ("log", "verbose", "no_attach", "attach_timeout")

    def __init__(
        self, log: Optional[Log] = None, no_attach: bool = False, attach_timeout: float = 5.0
    ) -> None:
        self.log: Log = log or _quiet
        self.verbose = log is not None
        self.no_attach = no_attach
        self.attach_timeout = attach_timeout


def _record(text: str, command: str, options: Options) -> Kind:
    from ..records.record import open_record
    from .record import Record

    return Record(text, command, open_record(text))


def _core(text: str, command: str, options: Options) -> Kind:
    from .core import Core

    return Core(text, command, log=options.log if options.verbose else None)


def _is_core(text: str) -> bool:
    from .core import is_core_path

    return is_core_path(text)


def _kind_of_record() -> Type[Kind]:
    from .record import Record

    return Record


def _kind_of_core() -> Type[Kind]:
    from .core import Core

    return Core


# The kinds a TARGET that names a file can be, tried in order: (is it one, open it, its class).
FILE_KINDS: List[Tuple[Callable[[str], bool], Callable[[str, str, Options], Kind], Callable[[], Type[Kind]]]]
FILE_KINDS = [
    (is_record_path, _record, _kind_of_record),
    (_is_core, _core, _kind_of_core),
]


def names_a_file_kind(text: str) -> bool:
    """Whether TARGET is a file of one of FILE_KINDS (a record, a core file)."""
    return any(claims(text) for claims, _, _ in FILE_KINDS)


def resolve(
    text: Optional[str], command: str, options: Options, ranks: Optional[str] = None,
    endpoints: Optional[str] = None, what: Optional[str] = None,
) -> Kind:  # fmt: skip
    """The kind TARGET names, for `command`. With `ranks` (or `endpoints`), the job it belongs to
    and the ranks chosen of it; `what`: how the error names the command asked with --ranks of a
    file (`query --ranks` by default)."""
    if text is not None:
        for claims, open_file, kind in FILE_KINDS:
            if not claims(text):
                continue
            if ranks is not None:
                of_file = kind()
                what = what or f"{command} --ranks"
                raise NotLive(
                    f"{what} needs a live process: {text} is {of_file.described}", hint=of_file.instead
                )
            return open_file(text, command, options)
    if ranks is not None or endpoints is not None:
        from .job import find

        return find(text, endpoints, ranks or "all", options, command)
    from ..target import Target
    from .process import Process

    target = Target(text, options.log if options.verbose else None, options.no_attach, options.attach_timeout)
    return Process(target, command)
