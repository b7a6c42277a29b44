"""One tool call, one `probing` command line: run as a child process of the server, in its own
session, with a deadline.

Why a child and not the engine in the server's own process: the server's stdout is the MCP
channel, and a byte printed there by anything the engine loads (a DuckDB warning, a library's
print) would break the assistant's session; a call past its deadline is killed with everything
it started (py-spy, gdb) and the server goes on; and the answer, its exit code and its words are
exactly the CLI's, checked by the CLI's own tests. A call costs the CLI's start, ~0.1-0.3 s,
which an assistant's turn does not notice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any, List, NamedTuple, Optional

import anyio

from ..errors import ExitCode

# The child runs the probing this server runs, wherever the server was started: `python -m probing`
# would import a `probing` folder of the working directory first (a clone's, or anyone's).
_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHILD = f"import sys; sys.path[0] = {_HOME!r}; from probing.cli import main; sys.exit(main())"
# What a call may print before it is cut: a query's rows beyond this are the tool's max_rows' job.
MAX_OUTPUT_BYTES = 16 << 20
# Beyond the CLI's own timeouts: its start, an attach, and the answer's rendering.
DEADLINE_MARGIN_S = 60.0


class CliAnswer(NamedTuple):
    command: List[str]  # probing's arguments, as a person would type them after `probing`
    exit_code: int
    stdout: str
    stderr: str
    value: Any  # stdout read as JSON; None where it is not JSON (or empty)

    @property
    def meaning(self) -> str:
        if self.exit_code < 0:
            return "the call ran past its deadline and was stopped"
        return ExitCode.MEANINGS.get(self.exit_code, "unknown exit code")

    @property
    def said(self) -> str:
        """What the CLI said on stderr (its error and hints, its notes), without the prefix."""
        return "\n".join(line.removeprefix("probing: ") for line in self.stderr.strip().splitlines())


async def run_cli(arguments: List[str], deadline_s: float, parse_json: bool = True) -> CliAnswer:
    """`probing ARGUMENTS` as a child; killed, with its session, past `deadline_s` or when the
    call is cancelled (the assistant gave up on it)."""
    command = [sys.executable, "-c", _CHILD, *arguments]
    process = await anyio.open_process(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    out, err = bytearray(), bytearray()
    exit_code = -1
    try:
        with anyio.move_on_after(deadline_s):
            async with anyio.create_task_group() as group:
                group.start_soon(_drain, process.stdout, out)
                group.start_soon(_drain, process.stderr, err)
            exit_code = await process.wait()
    finally:
        if process.returncode is None:
            _kill_session(process.pid)
            with anyio.CancelScope(shield=True):
                await process.wait()
        await process.aclose()
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    if len(out) >= MAX_OUTPUT_BYTES:
        # Cut JSON is no JSON: the call fails, saying so, rather than answer a part as the whole.
        exit_code = exit_code if exit_code else ExitCode.ERROR
        stderr += f"\nprobing: error: the answer was larger than {MAX_OUTPUT_BYTES >> 20} MiB: ask for less"
    if exit_code < 0:
        stderr += f"\nprobing: stopped after {deadline_s:.0f} s (the server's deadline for this call)"
    value = _json_of(stdout) if parse_json else None
    return CliAnswer(arguments, exit_code, stdout, stderr, value)


async def _drain(stream: Optional[Any], into: bytearray) -> None:
    if stream is None:
        return
    async for chunk in stream:
        if len(into) < MAX_OUTPUT_BYTES:
            into += chunk[: MAX_OUTPUT_BYTES - len(into)]


def _kill_session(pid: int) -> None:
    """The call's process and whatever it started (the CLI runs py-spy and gdb as children)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _json_of(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
