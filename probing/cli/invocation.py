"""What the global options say (the target, -v, --no-attach, --attach-timeout, --endpoints),
and the kind of target a command gets from them (engine/kinds). Click-free: the fast path uses
it too."""

from __future__ import annotations

import sys

from ..errors import UsageError
from .render import log_to_stderr, notes

# No typing at run time, and the kinds of target loaded when one is asked for: `probing PID
# backtrace` starts through here (CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

    from ..engine.kinds import Kind


class Invocation:
    __slots__ = ("target_text", "verbose", "no_attach", "attach_timeout", "endpoints", "command")

    def __init__(
        self,
        target_text: Optional[str],
        verbose: bool,
        no_attach: bool = False,
        attach_timeout: float = 5.0,
        endpoints: Optional[str] = None,
    ) -> None:
        self.target_text = target_text
        self.endpoints = endpoints  # --endpoints: the job's agents over TCP, instead of a TARGET
        self.verbose = verbose
        self.no_attach = no_attach
        self.attach_timeout = attach_timeout
        self.command: Optional[str] = None  # the command's name, for messages (set by click)

    def kind(self, ranks: Optional[str] = None, what: Optional[str] = None) -> Kind:
        """What TARGET names: a process, a record, a core file; with --ranks (or --endpoints),
        the job of ranks. What finding a job found worth saying is said here, before any work.
        `what`: the command as an error about --ranks of a file names it."""
        from ..engine.kinds import Options, resolve

        options = Options(log_to_stderr if self.verbose else None, self.no_attach, self.attach_timeout)
        kind = resolve(self.target_text, self.command or "this command", options, ranks, self.endpoints, what)
        notes(kind.notes)
        return kind


def read_argument(value: str, what: str) -> str:
    """`-` means: read it from standard input (for code or SQL with quotes and newlines)."""
    text = sys.stdin.read() if value == "-" else value
    if not text.strip():
        raise UsageError(f"empty {what}")
    return text
