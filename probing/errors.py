"""Every failure a user can meet, each with its exit code and the hint that fixes it.

The CLI has one handler that turns these into messages; nothing below the CLI prints. A class
carries its usual hint (`default_hint`); a raise site passes `hint=` only where it knows better,
and `hint=""` where no hint applies.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional


class ExitCode:
    """Exit codes of `probing`; `probing --help` prints this table.

    Plain int constants rather than an IntEnum: importing enum would cost `probing PID
    backtrace` ~4 ms, a third of what a whole py-spy dump takes.
    """

    OK = 0
    ERROR = 1
    USAGE = 2
    NO_SUCH_PROCESS = 3
    NOT_PYTHON = 4
    PERMISSION_DENIED = 5
    NO_AGENT = 6
    AGENT_TIMEOUT = 7
    REMOTE_ERROR = 8
    BAD_SQL = 9
    ATTACH_TIMEOUT = 10
    HUNG = 11
    NO_TORCH = 12
    BAD_REPLY = 13
    PARTIAL = 14
    BAD_RECORD = 15
    NOT_LIVE = 16
    TRACED = 17
    RECORD_NOT_WRITTEN = 18
    GIL_DISABLED = 19
    STRAGGLER = 20
    COMMAND_NOT_EXECUTABLE = 126
    COMMAND_NOT_FOUND = 127

    MEANINGS: Dict[int, str] = {
        OK: "success",
        ERROR: "any other error",
        USAGE: "bad command line",
        NO_SUCH_PROCESS: "no process with that PID",
        NOT_PYTHON: "the process is not a Python process probing supports (CPython 3.8+)",
        PERMISSION_DENIED: "not allowed to reach that process (another user's, or ptrace refused), "
        "or its socket is not its own",
        NO_AGENT: "the process has no probing agent",
        AGENT_TIMEOUT: "the agent did not answer in time (or eval ran past --timeout)",
        REMOTE_ERROR: "the code run by eval (or a statement piped into repl) raised an exception",
        BAD_SQL: "the SQL query failed",
        ATTACH_TIMEOUT: "attached, but the agent did not come up in time (the GIL is held)",
        HUNG: "hang / run --hang-timeout: no thread carrying the job progressed (--ranks: the job is stuck)",
        NO_TORCH: "trace / nan / memory --cuda-snapshot: the process has not imported torch (or CUDA)",
        BAD_REPLY: "what answered on the agent's socket sent a reply probing cannot use",
        PARTIAL: "--ranks: some ranks answered and others did not (the output names those missing and why)",
        BAD_RECORD: "the file is not a record or core file probing can read (cut short, foreign, "
        "or from another version)",
        NOT_LIVE: "the command needs a live process, and the target is a record or a core file",
        TRACED: "another tracer (gdb, strace...) holds the process, so probing cannot attach to it",
        RECORD_NOT_WRITTEN: "record: the agent could not write the record (its disk is full, or its "
        "record directory is refused)",
        GIL_DISABLED: "the job runs a free-threaded CPython with the GIL disabled, and the command "
        "would read its threads' frames, which is safe only under the GIL",
        STRAGGLER: "stragglers: some rank is late to the job's collectives (the output names it, and where)",
        COMMAND_NOT_EXECUTABLE: "probing run: the command is not executable",
        COMMAND_NOT_FOUND: "probing run: the command was not found",
    }


class ProbingError(Exception):
    """Base of every expected failure: a message, a hint and an exit code."""

    exit_code = ExitCode.ERROR
    default_hint: Optional[str] = None

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint: Optional[str] = (hint or None) if hint is not None else self.default_hint


class UsageError(ProbingError):
    exit_code = ExitCode.USAGE


class ProcessNotFound(ProbingError):
    exit_code = ExitCode.NO_SUCH_PROCESS


class NotPython(ProbingError):
    exit_code = ExitCode.NOT_PYTHON


class PermissionDenied(ProbingError):
    exit_code = ExitCode.PERMISSION_DENIED
    default_hint = "run probing as the user that owns the process, or as root"


class NoAgent(ProbingError):
    exit_code = ExitCode.NO_AGENT
    default_hint = (
        "drop --no-attach to attach to it, or start the job with the agent: "
        "`probing run -- python train.py` or `PROBING=1 python train.py`"
    )


class AgentTimeout(ProbingError):
    exit_code = ExitCode.AGENT_TIMEOUT


class EvalTimedOut(AgentTimeout):
    """eval ran past its --timeout; carries what the code printed until then."""

    default_hint = "raise --timeout if the code needs longer"

    def __init__(self, message: str, stdout: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


class AgentUnreachable(ProbingError):
    """The socket exists but the conversation failed (agent gone mid-request, protocol clash)."""

    exit_code = ExitCode.ERROR


class AgentBusy(AgentUnreachable):
    """Every connection of the agent runs a request (the message names them); backtrace falls
    back to reading from outside, and says why."""

    default_hint = "try again when one of those requests has ended"


class ProtocolMismatch(AgentUnreachable):
    """The agent speaks another protocol version."""

    default_hint = "use the same probing version for the CLI and the job"


class AgentFailed(ProbingError):
    """A bug in the agent: a handler raised where it should not have."""

    default_hint = "this is a bug in probing; please report it"


class RequestRefused(ProbingError):
    """The agent would not run the request as sent: a parameter it cannot take, a method it does
    not have, a reply too large to send, a window ended early, a statement still running."""


class NotFound(ProbingError):
    """The agent has no such table, thread or running function."""


class UntrustedSocket(PermissionDenied):
    """The socket found for a process is not that process's own: a directory or file of
    another user, a symlink, or another process answering on it."""

    default_hint = (
        "an agent's socket lies in a directory of the job's own user, mode 0700 "
        "(PROBING_SOCKET_DIR or /tmp/probing-UID); if the job set PROBING_SOCKET_DIR, "
        "check who else can write there"
    )


class BadReply(ProbingError):
    """What answered on the socket sent something that is not a valid reply: a different
    probing version, or not an agent at all. The job is untrusted input to the CLI."""

    exit_code = ExitCode.BAD_REPLY
    default_hint = (
        "use the same probing version for the CLI and the job; `probing -v PID ...` "
        "shows which process answered"
    )


class SessionGone(ProbingError):
    """The agent no longer holds a repl session (16 newer ones opened, or the agent restarted)."""


class AttachFailed(ProbingError):
    """The agent could not be put into the process (the process is left as it was)."""

    exit_code = ExitCode.ERROR


class TracedByAnother(ProbingError):
    """Another tracer (gdb, strace, a debugger) holds the process's threads: ptrace refuses a
    second one, even to root. The message names the tracer."""

    exit_code = ExitCode.TRACED
    default_hint = (
        "let that tracer finish or detach it (gdb: `detach` or `quit`; strace: Ctrl-C), then run "
        "probing again; a job started with the agent (`probing run -- python train.py`) needs no ptrace"
    )


class AttachTimeout(ProbingError):
    exit_code = ExitCode.ATTACH_TIMEOUT


class BadSQL(ProbingError):
    exit_code = ExitCode.BAD_SQL


class NoTorch(ProbingError):
    exit_code = ExitCode.NO_TORCH
    default_hint = (
        "torch features work once the job has imported torch; "
        "PROBING=1 PROBING_TORCH_TRACE=1 python train.py traces from the first step"
    )


class NoCuda(NoTorch):
    """The job has imported torch but keeps everything on the CPU."""

    default_hint = "the job keeps its tensors on the CPU: see `probing PID memory`"


class BadRecord(ProbingError):
    """A record or core file that cannot be read: cut short, not probing's, another version."""

    exit_code = ExitCode.BAD_RECORD


class RecordNotWritten(ProbingError):
    """`probing PID record`: the agent answered, and could not write the record: a full disk, a
    quota, a record directory it may not use. The message says which, as the job's system said it."""

    exit_code = ExitCode.RECORD_NOT_WRITTEN
    default_hint = (
        "free space where the job writes records (PROBING_RECORD_DIR, else <socket dir>/records: "
        "`probing records` lists them, oldest last), or give the live job another directory, "
        "mode 0700 and its user's: probing PID eval \"import os; os.environ['PROBING_RECORD_DIR'] "
        "= '/other/dir'\""
    )


class GilDisabled(ProbingError):
    """The job's CPython is free-threaded and runs with the GIL off: the agent refuses to read
    other threads' frames, which would race them (agent/gil.py)."""

    exit_code = ExitCode.GIL_DISABLED
    default_hint = (
        "restart the job with PYTHON_GIL=1 (the GIL back on) to read its threads from inside; "
        "eval, and tables the agent fills itself, work as they are (docs/install.md)"
    )


class NotLive(ProbingError):
    """A command that needs a running process (eval, repl, trace on...) given a record."""

    exit_code = ExitCode.NOT_LIVE
    default_hint = "a record holds what the job left; run this on a live process's PID instead"


class RemoteError(ProbingError):
    """Code run in the target raised; carries the remote traceback and what the code printed."""

    exit_code = ExitCode.REMOTE_ERROR

    def __init__(
        self,
        message: str,
        traceback: str = "",
        stdout: str = "",
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.traceback = traceback
        self.stdout = stdout
        self.stderr = stderr
